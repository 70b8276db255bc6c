"""Why did tiercache evict that block? Connect to a running engine and print its latest decisions.

Run while vLLM serves with the tiercache connector (inspect.socket: auto finds it; or pass a socket path):
    python examples/inspect_decisions.py [SOCKET]
"""

import sys

from tiercache.inspect import connect

with connect(sys.argv[1] if len(sys.argv) > 1 else None) as cache:
    stats = cache.stats()
    print(f"policy {stats.policy}, codec {stats.codec_id}, {stats.blocks} blocks stored")
    for tier in stats.tiers:
        used = f"{tier.stored_blocks}/{tier.capacity_blocks} blocks ({tier.occupancy:.0%})"
        print(f"  {tier.name}: {used}, {tier.hits} hits")
    rate = "n/a" if stats.hit_rate is None else f"{stats.hit_rate:.1%}"
    print(f"hit rate {rate}; {stats.evictions} evictions, {stats.evictions_dropped} of them dropped")

    for d in cache.decisions(limit=10):
        print(f"{d.age_s:6.1f}s ago  {d.action:16} {d.block_hash.hex()[:16]}  {d.policy or '':12} {d.reason}")
        if d.components:
            print(" " * 14 + ", ".join(f"{k}={v:.3g}" for k, v in d.components.items()))

    evicted = cache.decisions(limit=1, kinds=["eviction"])
    if evicted:
        print("\nexplain:", cache.explain(evicted[0].block_hash).summary)
