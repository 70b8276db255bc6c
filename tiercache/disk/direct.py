"""Positioned reads and writes of the disk tier's files, with direct I/O (O_DIRECT) where the file system
allows it and buffered I/O where it does not.

Provides:
    ALIGN                                   4096: slot sizes, file offsets and buffer addresses for direct I/O
    aligned(nbytes) -> mmap                 a page-aligned, zeroed buffer (anonymous mmap) of nbytes, its
                                            pages populated up front; from HUGE_BYTES on, in transparent
                                            huge pages where the kernel offers them (THP "madvise" or
                                            "always"): a direct read or write from 4 KiB pages scattered in
                                            memory took up to 2.5x as long on this project's virtual disk
                                            (more DMA segments a request), from huge pages it did not
    probe_direct(directory) -> str | None   None when O_DIRECT reads and writes work in `directory` (a probe
                                            file written, read and removed), else why not (EINVAL on tmpfs,
                                            no O_DIRECT on this OS, …)
    open_data(path, direct) -> int          a file descriptor for reading and writing `path` (created if
                                            missing), with O_DIRECT when direct
    write_at(fd, bufs, offset)              write the buffers back to back from `offset`: one pwritev (more
                                            only after a short write); with direct I/O each buffer's length,
                                            address and the offset are multiples of ALIGN
    read_at(fd, view, offset) -> int        fill `view` (a writable memoryview) from `offset`: the bytes read,
                                            fewer than len(view) only at the end of the file
    TMP_SUFFIX                              the suffix of the probe's file (a crash may leave it: the store
                                            removes such files at start)
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import uuid
from collections.abc import Sequence

ALIGN = 4096
HUGE_BYTES = 2 << 20
TMP_SUFFIX = ".tmp"
_DIRECT = getattr(os, "O_DIRECT", 0)
_POPULATE_WRITE = 23  # MADV_POPULATE_WRITE (Linux 5.14); Python's mmap module does not name it
_IOV_MAX = 1024  # buffers per pwritev (Linux's IOV_MAX)


def aligned(nbytes: int) -> mmap.mmap:
    """Populated at once where the OS can (MAP_POPULATE, MADV_POPULATE_WRITE): one call instead of a page
    fault per page while a direct read fills it."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    huge = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_BYTES or huge is None:
        return mmap.mmap(-1, max(nbytes, 1), flags=flags | getattr(mmap, "MAP_POPULATE", 0))
    buf = mmap.mmap(-1, nbytes, flags=flags)
    with contextlib.suppress(OSError):  # THP off ("never"): 4 KiB pages
        buf.madvise(huge)
    try:
        buf.madvise(_POPULATE_WRITE)
    except OSError:  # before Linux 5.14: a write a page
        for at in range(0, nbytes, mmap.PAGESIZE):
            buf[at] = 0
    return buf


def probe_direct(directory: str) -> str | None:
    if not _DIRECT:
        return "this OS has no O_DIRECT"
    path = os.path.join(directory, f".probe-{uuid.uuid4().hex}{TMP_SUFFIX}")
    buf = aligned(ALIGN)
    try:
        fd = open_data(path, True)
        try:
            write_at(fd, [buf], 0)
            if read_at(fd, memoryview(buf), 0) != ALIGN:
                return "a direct read returned a short count"
        finally:
            os.close(fd)
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        buf.close()


def open_data(path: str, direct: bool) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | (_DIRECT if direct else 0), 0o600)


def write_at(fd: int, bufs: Sequence, offset: int) -> None:
    views = [memoryview(b).cast("B") for b in bufs]
    k = 0
    while k < len(views):
        done = os.pwritev(fd, views[k : k + _IOV_MAX], offset)
        if done == 0:
            raise OSError(errno.EIO, "a write made no progress")
        offset += done
        while k < len(views) and done >= len(views[k]):
            done -= len(views[k])
            k += 1
        if done:  # a short write inside a buffer: the rest of it next
            views[k] = views[k][done:]


def read_at(fd: int, view: memoryview, offset: int) -> int:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break  # the end of the file
        done += n
    return done
