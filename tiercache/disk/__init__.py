"""The disk tier: block files on a local disk, below DRAM and above the remote store; they survive restarts.

Provides (both sides of the process boundary use them):
    files.py      block_dir, file_bytes, disk_blocks, scan: where the files are, how many fit, what is there
    direct.py     aligned buffers, whole-file reads and writes with direct I/O where the file system allows it
    store.py      DiskStore: one rank's files, with the calls of a RemoteStore that the remote tier's
                  write-behind queue and steps make (the worker side: connectors/worker/disk_steps.py)
The scheduler side's index of the files is tiercache.scheduler.disk_index; values are the remote tier's
(tiercache.remote.format: a header naming block, codec and size, and the payload's checksum).
"""
