"""The service's side of the socket file: binding it safely, clearing a dead one, knowing who connects.

Provides:
    listen(path) -> socket        bound in a private directory, chmod 0600, renamed into place, listening,
                                  non-blocking; InspectError (naming the fix) when it cannot be
    peer_creds(sock) -> (pid, uid) | None     the connecting process (Linux SO_PEERCRED; None elsewhere)
    peer_allowed(uid) -> bool     this user or root only (defense in depth behind mode 0600)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import tempfile
from pathlib import Path

from tiercache.inspect.paths import check_socket_path, listening
from tiercache.inspect.protocol import InspectError

logger = logging.getLogger(__name__)
BACKLOG = 64


def listen(path: Path) -> socket.socket:
    """Bind in a fresh private directory next to `path`, chmod 0600, then rename into place: the socket is
    never reachable with looser permissions, and the process umask is left alone."""
    check_socket_path(path)
    _clear_stale(path)
    tmpdir = Path(tempfile.mkdtemp(prefix=".tc", dir=path.parent))
    tmp = tmpdir / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(tmp))
        os.chmod(tmp, 0o600)
        sock.listen(BACKLOG)
        sock.setblocking(False)
        os.rename(tmp, path)
    except OSError as exc:
        sock.close()
        raise InspectError(
            f"inspect.socket: cannot listen on {str(path)!r} ({exc.strerror or exc}); choose a writable "
            "path, auto, or off"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        with contextlib.suppress(OSError):
            tmpdir.rmdir()
    return sock


def _clear_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InspectError(
            f"inspect.socket: {str(path)!r} exists and is not a socket; remove it or choose another path"
        )
    if not listening(path):
        path.unlink(missing_ok=True)  # nobody listening: a leftover from a process that died
        return
    raise InspectError(
        f"inspect.socket: {str(path)!r} is in use by a live process; choose another path, or auto"
    )


def peer_creds(sock: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the connecting process (Linux SO_PEERCRED); None where the platform cannot tell."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return pid, uid


def peer_allowed(uid: int | None) -> bool:
    if uid is None or uid in (os.getuid(), 0):
        return True
    logger.warning("tiercache: inspection connection from uid %d refused (serving uid %d)", uid, os.getuid())
    return False
