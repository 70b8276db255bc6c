"""Reading a small file a user named: a regular file only, and never blocking on one that is not.

Provides:
    read_regular(path, max_bytes) -> bytes   at most max_bytes + 1 bytes of the file (more than max_bytes:
                                             the file is longer); NotRegularFile for a directory, a FIFO, a
                                             device or a socket, refused from its stat before it is opened
                                             (opening a FIFO with no writer blocks) and checked again on the
                                             open file (the path may name another file since); OSError when
                                             it cannot be read
    NotRegularFile(OSError)                  .kind: what the path is ("a directory", "a FIFO (named pipe)", …)
"""

from __future__ import annotations

import os
import stat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))  # fmt: skip


class NotRegularFile(OSError):
    def __init__(self, kind: str) -> None:
        super().__init__(f"{kind}, not a regular file")
        self.kind = kind


def read_regular(path: str | os.PathLike, max_bytes: int) -> bytes:
    _check(os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        _check(os.fstat(fd).st_mode)
        return f.read(max_bytes + 1)


def _check(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegularFile(next((what for test, what in _KINDS if test(mode)), "not a file"))
