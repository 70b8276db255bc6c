"""Inspection: what the tier cache is doing and why, from Python or the shell, while vLLM runs.

Provides:
    connect(path=None, *, in_process=None, state=None, timeout=5.0) -> InspectClient   (client.py)
        .stats() -> Stats   .tiers() -> tuple[TierStats]   .decisions(limit=50) -> tuple[Decision]
        .explain(block_hash) -> Explanation   .blocks(tier=None, limit=100) -> tuple[BlockRecord]
        .explain_request(request_id=None, prompt_tokens=None) -> RequestExplanation   why a recent request
            missed, block by block (why.py: outcomes and causes)
    InspectionState      counters + recent decisions, published as immutable snapshots      (state.py)
    InspectionService    a process of its own serving a state on a Unix socket, mode 0600   (server.py)
    ServiceLimits        what the service may take from the engine and give each client    (limits.py)
    Stats, TierStats, TTFTStats, Decision, BlockRecord, Explanation, RequestExplanation, BlockOutcome
                         typed frozen results                                                 (results.py)
    prompt_digest(token_ids)   how a prompt is matched to a recent request            (request_log.py)
    InspectError         every client-side failure, with what to do                         (protocol.py)
    `tiercache inspect`  the CLI (cli.py); the wire format is in protocol.py

Wiring (scheduler side of the connector; all calls on the scheduler thread)::

    from tiercache.inspect import InspectionService, InspectionState

    state = InspectionState()                                        # once, next to the TierManager
    service = InspectionService.start(config.inspect, state)         # None when inspect.socket is "off"
    ...
    events = manager.take_events()                                   # wherever the connector drains them
    state.record(events)                                             # cheap: counters + a bounded ring
    state.publish(manager.view())                                    # every step; rate-limits itself to
                                                                     # one snapshot per 100 ms
    state.record_tokens(loaded=n_hit_tokens, recomputed=n_new)      # optional, per request
    state.record_ttft(seconds, hit=n_hit_tokens > 0)                 # optional, per request
    ...
    state.publish(manager.view(), force=True)                        # optional: after the last step
    if service is not None:
        service.close()                                              # at shutdown: process, socket, pointer

`InspectionService.start` raises InspectError (naming the fix) when the socket cannot be created (path too
long, directory missing, in use by a live process) or its process cannot be started. With inspect.socket
"auto" the socket is $XDG_RUNTIME_DIR/tiercache/tiercache-<pid>.sock or
/tmp/tiercache-$UID/tiercache-<pid>.sock, and that directory's `latest` file names it; `connect()` and
`tiercache inspect` find it there.

Processes: the service runs in a process of its own (`python -m tiercache.inspect.process`, started and
watched by InspectionService; it exits with the engine, and a crashed one is logged and started again), so
it shares no GIL with the scheduler. It answers from a mirror of the state (mirror.py) that each publish
updates through a socketpair (feed.py: what changed since the last publish, sent without blocking the
scheduler thread and within 2 % of its time; at most one publish interval, 0.1 s, old, or as long as that
share takes). The one request that reads the engine itself is `explain`: the block's entry and its graph
counters, read by the engine's thread for the service in batches (at most one every 20 ms, within 3 % of the
engine's time while it runs). Every request is bounded before any work; the service process's CPU time is
capped at a share of one core (25 % while the engine's process runs, 50 % while it is idle; 2 % for any one
connection); clients are served fairly (cheapest first); idle connections close after 5 s and a frame must
arrive whole within 2 s (ServiceLimits; benchmarks/inspect_attack.py measures it under attack and under
load). A connection with a request in progress is never idle; one its client closed leaves at once. The
client checks its arguments before sending (InspectError naming the fix) and every reply after; its timeout
bounds each whole request.
In one process (VLLM_ENABLE_V1_MULTIPROCESSING=0) `connect()` binds to the live state directly: same
methods, same types; called from the scheduler's own thread it publishes first, so nothing recorded is
missed.
"""

from tiercache.inspect.client import InspectClient, connect
from tiercache.inspect.limits import ServiceLimits
from tiercache.inspect.protocol import InspectError
from tiercache.inspect.request_log import prompt_digest
from tiercache.inspect.results import (
    BlockOutcome,
    BlockRecord,
    Decision,
    Explanation,
    RequestExplanation,
    Stats,
    TierStats,
    TTFTStats,
)
from tiercache.inspect.server import InspectionService
from tiercache.inspect.snapshot import Snapshot
from tiercache.inspect.state import InspectionState

__all__ = [
    "BlockOutcome",
    "BlockRecord",
    "Decision",
    "Explanation",
    "InspectClient",
    "InspectError",
    "InspectionService",
    "InspectionState",
    "RequestExplanation",
    "ServiceLimits",
    "Snapshot",
    "Stats",
    "TTFTStats",
    "TierStats",
    "connect",
    "prompt_digest",
]
