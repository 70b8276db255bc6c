"""Whole-file reads and writes of fixed-size block files, with direct I/O (O_DIRECT) where the file system
allows it and buffered I/O where it does not.

Provides:
    ALIGN                                   4096: file sizes and buffer addresses for direct I/O
    aligned(nbytes) -> mmap                 a page-aligned, zeroed buffer (anonymous mmap) of nbytes,
                                            its pages populated up front
    probe_direct(directory) -> str | None   None when O_DIRECT reads and writes work in `directory` (a probe
                                            file written, read and removed), else why not (EINVAL on tmpfs,
                                            no O_DIRECT on this OS, …)
    write_file(path, buf, direct)           create (or truncate) `path` and write buf (len a multiple of
                                            ALIGN, ALIGN-aligned, when direct); removed again on failure
    read_file(path, buf, direct) -> int     read `path` into buf (a writable memoryview, ALIGN-aligned when
                                            direct) when the file is exactly len(buf) bytes; returns the
                                            file's size (≠ len(buf): nothing read) or the bytes read
    TMP_SUFFIX                              the suffix of files being written (the store renames them once
                                            whole; a crash may leave them: removed at start by the store)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid

ALIGN = 4096
TMP_SUFFIX = ".tmp"
_DIRECT = getattr(os, "O_DIRECT", 0)


def aligned(nbytes: int) -> mmap.mmap:
    """Populated at once where the OS can (MAP_POPULATE): one call instead of a page fault per 4 KiB
    while a direct read fills it."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, max(nbytes, 1), flags=flags)


def probe_direct(directory: str) -> str | None:
    if not _DIRECT:
        return "this OS has no O_DIRECT"
    path = os.path.join(directory, f".probe-{uuid.uuid4().hex}{TMP_SUFFIX}")
    buf = aligned(ALIGN)
    try:
        write_file(path, buf, True)
        if read_file(path, memoryview(buf), True) != ALIGN:
            return "a direct read returned a short count"
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    finally:
        _unlink(path)
        buf.close()


def write_file(path: str, buf, direct: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (_DIRECT if direct else 0), 0o600)
    try:
        view = memoryview(buf)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], done)
    except BaseException:
        os.close(fd)
        _unlink(path)
        raise
    os.close(fd)


def read_file(path: str, buf: memoryview, direct: bool) -> int:
    fd = os.open(path, os.O_RDONLY | (_DIRECT if direct else 0))
    try:
        size = os.fstat(fd).st_size
        if size != len(buf):
            return size
        done = 0
        while done < size:
            n = os.preadv(fd, [buf[done:]], done)
            if n == 0:
                return done  # shrank since the fstat
            done += n
        return done
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
