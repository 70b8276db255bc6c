"""The disk tier: blocks in slots of segment files on a local disk, below DRAM and above the remote store,
named by an index; they survive restarts.

Provides (both sides of the process boundary use files.py and index.py):
    files.py      block_dir, file_bytes, disk_slots, disk_blocks, scan: where the files are, how many blocks
                  fit, what is there
    index.py      the slot index: one record per slot, read at start by both sides
    segments.py   the segment files: runs of slots read and written in one call each
    direct.py     aligned buffers, positioned reads and writes with direct I/O where the file system allows it
    buffers.py    the store's host buffers: the writer's values (ValuePool), ReadBuffer
    restore.py    what the store finds at start: the blocks within the size; old-format files removed
    store.py      DiskStore: one rank's blocks, with the calls of a RemoteStore that the remote tier's
                  write-behind queue and steps make (the worker side: connectors/worker/disk_steps.py)
The scheduler side's index of the files is tiercache.scheduler.disk_index; values are the remote tier's
(tiercache.remote.format: a header naming block, codec and size, and the payload's checksum).
"""
