"""Where inspection sockets live and how a client finds one.

Provides:
    SOCKET_ENV = "TIERCACHE_INSPECT_SOCKET"   a socket path the client uses when none is passed
    socket_dirs() -> list[Path]               $XDG_RUNTIME_DIR/tiercache (when set), /tmp/tiercache-$UID
    auto_socket_path() -> Path                <first usable dir>/tiercache-<pid>.sock (dir created 0700;
                                              tiercache-<pid>-<k>.sock for a second service in one process);
                                              first removes the socket files of dead processes there
    listening(path) -> bool                   a server accepts connections there
    private_dir(path) -> Path                 create/check a directory only this user can use
    write_pointer(sock_path) / clear_pointer(sock_path)   the dir's `latest` file names the newest socket;
                                              written to a fresh file (O_EXCL: never through a symlink) in
                                              the private directory, then renamed over `latest`; read with
                                              O_NOFOLLOW
    discover() -> Path | None                 $TIERCACHE_INSPECT_SOCKET, else each dir's `latest` if its
                                              process is alive, else its newest live tiercache-<pid>.sock
    live_sockets() -> list[Path]              every live socket there, newest first (tiercache inspect --list)
    check_socket_path(path)                   raise (saying what to do) for paths a socket cannot bind to
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import tempfile
from pathlib import Path

from tiercache.inspect.protocol import InspectError

SOCKET_ENV = "TIERCACHE_INSPECT_SOCKET"
POINTER = "latest"
MAX_PATH_BYTES = 107  # sun_path is 108 bytes including the terminating NUL
_SOCKET_NAME = re.compile(r"tiercache-(\d+)(?:-\d+)?\.sock$")


def socket_dirs() -> list[Path]:
    dirs = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        dirs.append(Path(runtime) / "tiercache")
    dirs.append(Path(tempfile.gettempdir()) / f"tiercache-{os.getuid()}")
    return dirs


def private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or accept it when it is ours and closed to others; else InspectError."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise InspectError(
            f"{path} exists but is not a directory private to this user (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}); remove it, or set inspect.socket to a path of your own"
        )
    return path


def auto_socket_path() -> Path:
    """tiercache-<pid>.sock, or tiercache-<pid>-<k>.sock when this process already serves one."""
    errors = []
    for directory in socket_dirs():
        try:
            private_dir(directory)
        except (OSError, InspectError) as exc:
            errors.append(str(exc))
            continue
        _sweep(directory)
        for k in range(1000):
            path = directory / (
                f"tiercache-{os.getpid()}.sock" if k == 0 else f"tiercache-{os.getpid()}-{k}.sock"
            )
            if not listening(path):
                break
        if len(os.fsencode(path)) <= MAX_PATH_BYTES:
            return path
        errors.append(f"{path}: longer than {MAX_PATH_BYTES} bytes")
    raise InspectError(
        "inspect.socket: auto found no usable directory (" + "; ".join(errors) + "); set inspect.socket to "
        "a writable path, or off"
    )


def listening(path: Path, timeout: float = 0.5) -> bool:
    """Whether a server accepts connections on `path` (False for a leftover socket file)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(timeout)
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise InspectError(
            f"inspect.socket: {str(path)!r} is {len(os.fsencode(path))} bytes; unix socket paths are limited "
            f"to {MAX_PATH_BYTES}: choose a shorter path, or auto"
        )
    if not path.parent.is_dir():
        raise InspectError(f"inspect.socket: directory {str(path.parent)!r} does not exist; create it first")


def write_pointer(sock_path: Path) -> None:
    """mkstemp creates a new file (O_CREAT | O_EXCL, mode 0600: a symlink planted there makes it fail, it is
    never followed), and rename replaces `latest` itself, whatever it was, never what it points to."""
    directory = private_dir(sock_path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{POINTER}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(str(sock_path) + "\n")
        os.replace(tmp, directory / POINTER)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def clear_pointer(sock_path: Path) -> None:
    pointer = sock_path.parent / POINTER
    with contextlib.suppress(OSError):
        if _read_pointer(pointer) == str(sock_path):
            pointer.unlink()


def _read_pointer(pointer: Path) -> str:
    """The pointer's text, not following a symlink (OSError for one), at most 4 KiB."""
    fd = os.open(pointer, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        return os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)


def _sweep(directory: Path) -> None:
    """Remove socket files of processes that are gone (a crash, SIGKILL): nobody can connect to them."""
    for path in directory.glob("tiercache-*.sock"):
        match = _SOCKET_NAME.search(path.name)
        with contextlib.suppress(OSError):
            if match and not _pid_alive(int(match.group(1))) and stat.S_ISSOCK(os.lstat(path).st_mode):
                path.unlink()
    with contextlib.suppress(OSError):
        target = Path(_read_pointer(directory / POINTER))
        if target.parent == directory and not target.exists():
            (directory / POINTER).unlink()


def discover() -> Path | None:
    env = os.environ.get(SOCKET_ENV)
    if env:
        return Path(env)
    for directory in socket_dirs():
        found = _in_dir(directory)
        if found is not None:
            return found
    return None


def live_sockets() -> list[Path]:
    """Every live tiercache socket in the socket directories, newest first."""
    found = []
    for directory in socket_dirs():
        if _own_dir(directory):
            live = [p for p in directory.glob("tiercache-*.sock") if _alive_socket(p)]
            found += sorted(live, key=_mtime, reverse=True)
    return found


def _in_dir(directory: Path) -> Path | None:
    if not _own_dir(directory):
        return None  # someone else's directory: never follow it
    with contextlib.suppress(OSError):
        path = Path(_read_pointer(directory / POINTER))
        if path.parent == directory and _alive_socket(path):
            return path
    live = [p for p in directory.glob("tiercache-*.sock") if _alive_socket(p)]
    return max(live, key=_mtime, default=None)


def _own_dir(directory: Path) -> bool:
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _alive_socket(path: Path) -> bool:
    match = _SOCKET_NAME.search(path.name)
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return match is None or _pid_alive(int(match.group(1)))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
