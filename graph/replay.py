"""Replay API: test an eviction policy on your own trace.

Provides `replay(requests, policy, capacity_blocks, weights=None) -> ReplayResult` and `ReplayResult`.

```python
from tiercache.graph import replay
result = replay(requests, policy="graph", capacity_blocks=10_000)   # policy: "graph" | "lru" | "arc"
result.hit_rate   # fraction of requested blocks found cached (a hit only counts with its full prefix)
```

`requests` is an iterable of requests; each request is a list of block hashes in prefix order (block i's
hash depends on blocks 0..i), or of `(hash, source_label)` pairs (labels from `scoring.SOURCES`; plain
hashes are "unknown"). Hashes are usually bytes; any hashable works. The cache protocol (capacity in blocks,
full-prefix hits, what a miss inserts) is in `tiercache.graph.simulators`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from tiercache.graph.scoring import ScoreWeights, source_code
from tiercache.graph.simulators import make_cache


@dataclass(frozen=True)
class ReplayResult:
    """Counters of one replay. `hit_rate` = blocks_hit / blocks_requested."""

    policy: str
    capacity_blocks: int
    requests: int
    blocks_requested: int
    blocks_hit: int
    evictions: int
    requests_with_hit: int

    @property
    def hit_rate(self) -> float:
        return self.blocks_hit / self.blocks_requested if self.blocks_requested else 0.0


def split_request(request: Sequence) -> tuple[list[Hashable], list[int]]:
    """(hashes, source codes) of one request given as hashes or as (hash, source_label) pairs."""
    if request and isinstance(request[0], tuple):
        return [h for h, _ in request], [source_code(label) for _, label in request]
    return list(request), [0] * len(request)


def replay(
    requests: Iterable[Sequence],
    policy: str = "graph",
    capacity_blocks: int = 10_000,
    weights: ScoreWeights | None = None,
) -> ReplayResult:
    """Run `requests` through a prefix cache of `capacity_blocks` blocks under `policy`."""
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
    cache = make_cache(policy, capacity_blocks, weights)
    n_req = n_blocks = n_hit = n_req_hit = 0
    for request in requests:
        blocks, sources = split_request(request)
        hit = cache.process(blocks, sources)
        n_req += 1
        n_blocks += len(blocks)
        n_hit += hit
        n_req_hit += hit > 0
    return ReplayResult(policy, capacity_blocks, n_req, n_blocks, n_hit, cache.evictions, n_req_hit)
