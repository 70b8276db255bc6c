"""Least recently used: the manager's candidates come least recently used first, so LRU takes them in order.

Provides:
    LRUPolicy(clock=time.monotonic)     choose_victims(tier, n, candidates): the first n, with their idle time
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tiercache.scheduler.policies.base import Candidates, EvictionPolicy, VictimDecision


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.monotonic

    def choose_victims(self, tier: str, n: int, candidates: Candidates) -> list[VictimDecision]:
        now = self._clock()
        out: list[VictimDecision] = []
        for block_hash in candidates:
            if len(out) == n:
                break
            idle = now - candidates.info(block_hash).last_access
            out.append(
                VictimDecision(
                    block_hash,
                    reason=f"least recently used in {tier} (idle {idle:.3f}s)",
                    score=-idle,
                    components=(("idle_s", idle),),
                    policy=self.name,
                )
            )
        return out
