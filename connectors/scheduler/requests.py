"""What the scheduler side remembers of vLLM's requests: their block hashes, the vLLM block ids they hold,
and which blocks become full in a step (those are stored).

Provides:
    RequestTracker(block_size)
        admit(request, num_computed_tokens) -> TrackedRequest   remember (or refresh) a request
        get(request_id) / finish(request_id)
        loads_failed(block_ids)                         marks the requests those loads were for as retried
        external_blocks(state, block_ids, num_external_tokens) -> (hashes, block ids)   the blocks vLLM
                                                    counts as loaded from the connector
        newly_full(scheduler_output) -> {block hash: (vLLM block id, request id)}   blocks that become full
                                                    this step, and the request that computed each
    scheduled(scheduler_output)   (req_id, num_computed before the step, new block ids, resumed) per request

vLLM's Request and SchedulerOutput are read by attribute only (no vLLM import): request_id, num_tokens,
num_prompt_tokens, block_hashes; scheduled_new_reqs, scheduled_cached_reqs, num_scheduled_tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class TrackedRequest:
    request: object  # vllm Request (its block_hashes grow as tokens are appended)
    block_ids: list[int] = field(default_factory=list)
    local_computed: int = 0  # tokens vLLM had computed itself when the connector was asked
    load_block_ids: frozenset[int] = frozenset()  # vLLM blocks its last admission's loads write
    retry: bool = False  # one of those loads failed: vLLM's next admission of it retries this one
    asked: bool = False  # the connector was asked for its hits and has not seen the allocation since


class RequestTracker:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._requests: dict[str, TrackedRequest] = {}

    def admit(self, request, num_computed_tokens: int | None = None) -> TrackedRequest:
        state = self._requests.setdefault(request.request_id, TrackedRequest(request))
        state.request = request
        if num_computed_tokens is not None:
            state.local_computed = num_computed_tokens
        return state

    def get(self, request_id: str) -> TrackedRequest | None:
        return self._requests.get(request_id)

    def finish(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def loads_failed(self, block_ids: set[int]) -> None:
        """Loads into these vLLM blocks failed: the requests they were for are retried by vLLM."""
        for state in self._requests.values():
            if not state.load_block_ids.isdisjoint(block_ids):
                state.retry = True

    def external_blocks(
        self, state: TrackedRequest, block_ids: list[int], num_external_tokens: int
    ) -> tuple[list[bytes], list[int]]:
        first = state.local_computed // self.block_size
        count = num_external_tokens // self.block_size
        hashes = list(state.request.block_hashes[first : first + count])
        return hashes, block_ids[first : first + count]

    def newly_full(self, scheduler_output) -> dict[bytes, tuple[int, str]]:
        """Block hash → (vLLM block id, request id) of each block that becomes full this step (tracks the
        block ids)."""
        wanted: dict[bytes, tuple[int, str]] = {}
        for req_id, num_computed, new_ids, resumed in scheduled(scheduler_output):
            state = self._requests.get(req_id)
            if state is None:
                continue
            if resumed:
                state.block_ids = list(new_ids or [])
            elif new_ids:
                state.block_ids.extend(new_ids)
            done = num_computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            hashes = state.request.block_hashes
            last = min(done // self.block_size, len(hashes), len(state.block_ids))
            for i in range(num_computed // self.block_size, last):
                wanted.setdefault(hashes[i], (state.block_ids[i], req_id))
        return wanted


def scheduled(scheduler_output) -> Iterator[tuple[str, int, list[int] | None, bool]]:
    """(req_id, num_computed_tokens before this step, new block ids of group 0, resumed) per request."""
    for new in scheduler_output.scheduled_new_reqs:
        yield new.req_id, new.num_computed_tokens, list(new.block_ids[0]) if new.block_ids else [], True
    cached = scheduler_output.scheduled_cached_reqs
    resumed = getattr(cached, "resumed_req_ids", set()) or set()
    for i, req_id in enumerate(cached.req_ids):
        new_ids = cached.new_block_ids[i]
        yield req_id, cached.num_computed_tokens[i], list(new_ids[0]) if new_ids else None, req_id in resumed
