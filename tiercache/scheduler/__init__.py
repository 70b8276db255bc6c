"""The scheduler side: runs in vLLM's scheduler process and decides where every block lives. The workers
learn its decisions only through the wire types of tiercache.wire; it imports nothing from tiercache.worker.

Provides:
    abstract.py     TierManagerBase (the verbs, as vLLM's OffloadingManager) and the Prepare*Output results
    manager.py      TierManager: the one owner of block state (index, slots, jobs, events), made of:
    core.py         ManagerCore: the state, and the primitives that change it (room plans, moves, drops)
    loads.py        LoadVerbs: lookup, where, info, prepare_load, complete_load, touch, prefetch
    stores.py       StoreVerbs: prepare_store (with the policy's admission control), complete/abort_store
    transfers.py    TransferVerbs: take_jobs, complete_transfer, spill
    remote_tier.py  RemoteVerbs: take_uploads, prepare_fetch, complete_fetch
    disk_tier.py    DiskVerbs: disk_prefix, prepare_disk_read, complete_disk_read, take_disk_plan,
                    restore_disk
    disk_index.py   DiskIndex: the disk tier's files (what to write, what to drop), owned by the manager
    blocks.py       BlockIndex, BlockEntry: block hash → tier, slot, state; each tier's recency order
    recency.py      RecencyOrder: the one least-recently-used order (also the replay's LRU simulator's)
    allocator.py    SlotAllocator: slots as contiguous runs
    moves.py        Mover (room plans the manager applies), JobBook (transfer jobs in flight)
    events.py       frozen events with reasons; event_log.py: numbered, shown to the policy, drained
    policies/       the eviction seam, LRU, and the graph advisor's adapter (tiercache.graph)
    views.py        ManagerView: read-only state for inspection, invariants and tests
    invariants.py   the manager's consistency checks
"""
