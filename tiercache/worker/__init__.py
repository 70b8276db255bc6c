"""The worker side: runs in each GPU worker process (one per tensor-parallel rank) and executes what the
scheduler side planned, on this rank's pools. It imports nothing from tiercache.scheduler: plans arrive as
the wire types of tiercache.wire.

Provides:
    pools.py        VramPool (the kernels' 5-D format on the device), DramPool (pinned, block-major), KVBlocks
    transfer.py     TransferEngine: spill and warm DMA between the pools, one stream per direction
    tags.py         SlotTags: which block each slot holds, checked before a load or a move reads it
    tier_worker.py  TierWorker: stores, loads and jobs of one rank
"""
