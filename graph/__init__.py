"""Block-relationship graph, background eviction advisor and policy replay, importable as tiercache.graph.

- `KVCacheGraph` (kvgraph.py): blocks and their five edge types, fed by the manager's notifications; its
  per-block counters and their update rules are the scoring core (`BlockCounters`, counters.py), which the
  replay's graph policy drives too. It keeps no recency order: the tier manager owns the one order.
- `GraphEvictionAdvisor`, `Snapshot` (advisor.py): background ranking, lock-free hot-path reads; its
  thread ranks soon after the graph changes, at most a fifth of the time (cadence.py).
- `EvictionDecision` (events.py): one eviction as data.
- `ScoreWeights`, `ScoreComponents`, `SOURCES` (scoring.py): the documented score formula.
- `ReuseStats` (reuse.py): each block class's reuse probability, learned online (a term of the score).
- `replay`, `ReplayResult` (replay.py): graph / LRU / ARC on your own trace (simulators.py, graph_cache.py:
  the graph policy on a one-tier KVCacheGraph; LRU on `tiercache.scheduler.recency.RecencyOrder`).
- `timed_replay` (timed_replay.py): the graph policy as it runs live on a timestamped trace: the advisor
  ranks on its own schedule in the trace's time and evictions and admission read its last snapshot.
- `offline_bound` (offline.py): Belady's farthest-next-use rule with bypass on the same trace, to compare.
- Adaptive fallback (arc.py): a shadow ARC sees every request (`KVCacheGraph.on_request`); while the graph's
  ranking loses to it by two standard deviations the cache follows ARC (`graph.mode`), and tries the graph
  again later.
- `AdmissionDecision` (events.py): a block offered for storing and declined, with its reason.
"""

from tiercache.graph.advisor import GraphEvictionAdvisor, Snapshot
from tiercache.graph.events import AdmissionDecision, EvictionDecision
from tiercache.graph.kvgraph import EDGE_TYPES, KVCacheGraph
from tiercache.graph.offline import offline_bound
from tiercache.graph.replay import ReplayResult, replay
from tiercache.graph.reuse import ReuseStats
from tiercache.graph.scoring import SOURCES, ScoreComponents, ScoreWeights
from tiercache.graph.timed_replay import timed_replay

__all__ = [
    "EDGE_TYPES",
    "SOURCES",
    "AdmissionDecision",
    "EvictionDecision",
    "GraphEvictionAdvisor",
    "KVCacheGraph",
    "ReplayResult",
    "ReuseStats",
    "ScoreComponents",
    "ScoreWeights",
    "Snapshot",
    "offline_bound",
    "replay",
    "timed_replay",
]
