"""Eviction policies: the seam (base.py), least recently used (lru.py), the graph advisor's (graph.py).

Provides:
    EvictionPolicy, VictimDecision, DeclineDecision,
    BlockInfo, Candidates                                    the seam (base.py)
    LRUPolicy                                                lru.py
    make_policy(eviction_config)    "lru" → LRUPolicy; "graph" → GraphPolicy over tiercache.graph's advisor
                                    (a started thread: close() it), else LRU with one log line
"""

from __future__ import annotations

import logging

from tiercache.scheduler.policies.base import (
    BlockInfo,
    Candidates,
    DeclineDecision,
    EvictionPolicy,
    VictimDecision,
)
from tiercache.scheduler.policies.lru import LRUPolicy

logger = logging.getLogger(__name__)


def make_policy(config=None) -> EvictionPolicy:
    """The policy a config names: "lru", or "graph" (a started advisor thread: close() the policy, or the
    manager, when done). If the graph package cannot be imported, LRU with one log line."""
    name = getattr(config, "policy", "lru")
    if name == "lru":
        return LRUPolicy()
    try:
        from tiercache.scheduler.policies.graph import make_graph_policy

        return make_graph_policy(config)
    except ImportError as exc:
        logger.warning("tiercache: eviction.policy=graph unavailable (%s); using LRU", exc)
        return LRUPolicy()


__all__ = [
    "BlockInfo",
    "Candidates",
    "DeclineDecision",
    "EvictionPolicy",
    "LRUPolicy",
    "VictimDecision",
    "make_policy",
]
