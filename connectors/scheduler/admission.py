"""The ConnectorScheduler's admission verbs (vLLM's get_num_new_matched_tokens, update_state_after_alloc):
how much of a prompt the tiers (and the remote store) hold, and the loads and fetches queued for the next
plan. A mixin of SchedulerCore (core.py); ConnectorScheduler (connector_scheduler.py) combines it with the
others.

Provides:
    AdmissionVerbs
        num_matched_tokens(request, num_computed_tokens) -> int | None   longest ready prefix (no events),
                                                                  extended by the blocks the disk tier,
                                                                  then the remote store, hold next (None
                                                                  while the store is being asked:
                                                                  remote_lookups.py); 0 for vLLM's retry
                                                                  after failed loads
        after_alloc(request, block_ids, num_external_tokens)      pins the hit blocks, queues their loads
                                                                  (disk and remote hits: a DRAM slot each,
                                                                  filled by the workers before the load);
                                                                  records the admission (a RequestRecord)
                                                                  unless it is vLLM's retry after failed
                                                                  loads
        refuse_loads(request, block_ids, num_external_tokens)     fallback: queue them refused instead
    caller_id(request_id) -> str | None     the id the caller gave, when vLLM appended its random suffix

Loads take vLLM's asynchronous path (connectors/vllm.py): a block counted as loaded but refused or failed on
a worker is reported as a load error and vLLM recomputes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tiercache.inspect.request_log import RequestRecord, prompt_digest
from tiercache.wire import DISK, DRAM, REMOTE, LoadItem, RemoteItem

from .core import SchedulerCore


class AdmissionVerbs(SchedulerCore):
    def num_matched_tokens(self, request, num_computed_tokens: int) -> int | None:
        """0 for vLLM's retry of a request whose loads failed: it recomputes what it did not load, as it
        would had the failure been found before its admission (offering the same hits again could fail the
        same way for ever). None while the remote store is being asked about the prompt's next blocks (vLLM
        asks again next step)."""
        state = self.requests.admit(request, num_computed_tokens)
        state.asked = True
        if state.retry:
            return 0
        max_blocks = (request.num_tokens - 1) // self.block_size  # one token is always recomputed
        hashes = request.block_hashes[:max_blocks]
        hit = self.manager.lookup(hashes, record=False)
        hit = max(hit, num_computed_tokens // self.block_size)
        hit += self.manager.disk_prefix(hashes[hit:])
        remote = self._remote_prefix(request.request_id, hashes[hit:])
        if remote is None:
            return None
        return max(0, (hit + remote) * self.block_size - num_computed_tokens)

    def _remote_prefix(self, request_id: str, hashes: Sequence[bytes]) -> int | None:
        """How many of these blocks, from the first, the remote store holds: one batched existence call,
        on the lookup thread (None until it answers). Stops before a block the manager knows (in flight or
        bad here: a fetch of it would be refused)."""
        if self.remote is None:
            return 0
        todo = []
        for block_hash in hashes:
            if self.manager.info(block_hash) is not None:
                break
            todo.append(block_hash)
        if not todo:
            return 0
        answer = self.remote_lookups.found(request_id, todo)
        if answer is None:
            return None
        n = next((i for i, found in enumerate(answer.found) if not found), len(todo))
        self.inspection.record_remote(lookups=len(todo), found=n)
        return n

    def after_alloc(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        """Queue the loads first, then the policy hints and statistics: if a hint fails, the fallback
        (refuse_loads) finds the loads already queued and changes nothing."""
        state = self.requests.admit(request)
        if not state.asked:  # vLLM's call when a request whose loads ended is scheduled: admitted before
            return
        state.asked = False
        retry, state.retry = state.retry, False
        fetched: dict[bytes, str] = {}  # block → the tier it is read from (DISK, REMOTE)
        if num_external_tokens > 0:
            self._load_requests.append(request.request_id)  # first: a fallback must find it queued
            hashes, ids = self.requests.external_blocks(state, block_ids, num_external_tokens)
            state.load_block_ids = frozenset(ids)
            below = self.remote is not None or self.config.tiers.disk is not None
            local = self.manager.lookup(hashes, record=False) if below else len(hashes)
            self._queue_loads(hashes[:local], ids[:local], self.manager.prepare_load)
            disk = local + self.manager.disk_prefix(hashes[local:])
            if disk > local:
                self._queue_loads(hashes[local:disk], ids[local:disk], self.manager.prepare_disk_read,
                                  self._disk_reads)  # fmt: skip
                read = {f.block_hash for f in self._disk_reads}.intersection(hashes[local:disk])
                fetched.update(dict.fromkeys(read, DISK))
                self.inspection.record_disk(hits=len(read))
            if disk < len(hashes) and self.remote is None:  # changed since the match: refused loads
                self._queue_loads(hashes[disk:], ids[disk:], self.manager.prepare_load)
            elif disk < len(hashes):  # the rest were found in the remote store
                self._queue_loads(hashes[disk:], ids[disk:], self.manager.prepare_fetch, self._fetches)
                got = {f.block_hash for f in self._fetches}.intersection(hashes[disk:])
                fetched.update(dict.fromkeys(got, REMOTE))
        if retry:  # vLLM admits it again after its loads failed: it was counted and recorded the first time
            return
        self.manager.observe_request(request.request_id, list(request.block_hashes))
        first = state.local_computed // self.block_size
        last = (request.num_tokens - 1) // self.block_size
        self.manager.lookup(request.block_hashes[first:last])  # once per admission: hits and the first miss
        loaded = max(num_external_tokens, 0)
        recomputed = max(request.num_prompt_tokens - state.local_computed - loaded, 0)
        self.inspection.record_tokens(loaded=loaded, recomputed=recomputed)
        self._remember(request, state.local_computed, loaded, recomputed, last, fetched)

    def _queue_loads(self, hashes: list[bytes], ids: list[int], prepare, fills: list | None = None) -> None:
        """prepare: the manager's prepare_load, prepare_disk_read or prepare_fetch (raises having pinned
        nothing). None: changed since the lookup, or no room: the workers report these as load errors →
        recompute. fills: where the DRAM slots to fill before the loads are queued (disk reads, fetches)."""
        if not hashes:
            return
        out = prepare(hashes)
        if out is None:
            self._loads += [LoadItem(h, None, -1, b) for h, b in zip(hashes, ids, strict=True)]
            return
        placed = list(zip(out.block_hashes, out.tiers, out.slots, ids, strict=True))
        self._loads += [LoadItem(h, t, s, b) for h, t, s, b in placed]
        if fills is not None:
            fills += [RemoteItem(h, s) for h, t, s, _ in placed if t == DRAM]

    def _remember(
        self, request, vllm_tokens: int, loaded: int, recomputed: int, last: int, fetched: dict[bytes, str]
    ) -> None:
        """The admission as inspection's explain_request will tell it: where each block of the prompt was
        (fetched: the blocks being read for it from the disk tier or the remote store, and from which)."""
        hashes = tuple(request.block_hashes[:last])
        local = self.manager.where(hashes)
        where = [(fetched[h], None) if h in fetched else w for h, w in zip(hashes, local, strict=True)]
        gone = self.inspection.departures.get
        self.inspection.record_request(
            RequestRecord(
                request_id=request.request_id,
                external_id=caller_id(request.request_id),
                digest=prompt_digest(getattr(request, "prompt_token_ids", None)),
                clock=self.manager.view().clock(),
                wall=time.time(),
                block_size=self.block_size,
                block_hashes=hashes,
                vllm_blocks=vllm_tokens // self.block_size,
                hit_blocks=loaded // self.block_size,
                where="".join(RequestRecord.where_code(tier, reason) for tier, reason in where),
                unreadable={i: reason for i, (tier, reason) in enumerate(where) if tier and reason},
                departed={
                    i: event
                    for i, (tier, _) in enumerate(where)
                    if tier is None and (event := gone(hashes[i]))
                },
                prompt_tokens=request.num_prompt_tokens,
                tokens_loaded=loaded,
                tokens_recomputed=recomputed,
            )
        )

    def refuse_loads(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        """After a failure in after_alloc: vLLM counts these tokens as loaded, so the workers must report
        their blocks as load errors (vLLM recomputes them) — never leave them unwritten."""
        state = self.requests.admit(request)
        if num_external_tokens > 0 and request.request_id not in self._load_requests:
            self._load_requests.append(request.request_id)  # vLLM waits for it: it is reported received
        state.asked = False
        queued = {x.block_id for x in self._loads}
        hashes, ids = self.requests.external_blocks(state, block_ids, num_external_tokens)
        state.load_block_ids = frozenset(ids)
        self._loads += [LoadItem(h, None, -1, b) for h, b in zip(hashes, ids, strict=True) if b not in queued]


def caller_id(request_id: str) -> str | None:
    """The id the caller gave, when vLLM made this internal one from it by appending "-" and 8 random hex
    digits (its input processor does in 0.26, 0.32 and 0.33, unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION)."""
    head, dash, tail = request_id.rpartition("-")
    return head if dash and head and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail) else None
