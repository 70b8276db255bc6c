"""The inspection service, the engine's side: a Unix-domain socket (mode 0600) served by a process of its own
(process.py) from a mirror of an InspectionState, fed by the scheduler's publishes.

Provides:
    InspectionService.start(inspect_config, state, limits=None) -> InspectionService | None   None when the
        socket is "off"; "auto" → a per-process path (see paths.py) plus the directory's `latest` pointer
    InspectionService(state, path, *, pointer=False, limits=ServiceLimits())
        .path, .limits, .pid (the service process's; None while none runs), .running, .restarts
        .close()    ends the service process (it exits on its feed's EOF; killed after `timeout`), the
                    thread, the socket and the pointer; also run at exit, by atexit and by multiprocessing's
                    exit hook, so a Ctrl-C'd or forked engine leaves neither a file nor a process

The engine's process binds the socket (listener.py: errors name the fix) and keeps it; the service process
inherits it, with two socketpairs: the feed (feed.py: one Update per publish, sent by the scheduler thread
without blocking) and explain's point reads. The engine's one thread for the service ("tiercache-inspect")
answers those reads (reads.py: batched, within `limits.engine_cpu_share` of wall time while the engine's
other threads run), sends what the scheduler recorded after its last publish once it stops stepping
(Feed.catch_up), and watches the process: one that exits unasked is logged with its exit status and
started again, its mirror rebuilt from a full Update, up to MAX_RESTARTS times within RESTART_WINDOW; at the
next exit it is not: the socket is removed, and the error log says the engine runs on without it. The
service process exits when the engine closes its feed or dies (it watches its parent), so no engine leaves
one behind. Nothing in the service can raise into the scheduler: the feed swallows (and counts, and logs)
its failures, and a service process that cannot start is an InspectError at start, a log line later.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from multiprocessing import util as mp_util
from pathlib import Path

from tiercache.inspect import listener
from tiercache.inspect.feed import Feed
from tiercache.inspect.limits import ServiceLimits
from tiercache.inspect.paths import auto_socket_path, clear_pointer, write_pointer
from tiercache.inspect.protocol import InspectError
from tiercache.inspect.reads import PointReads
from tiercache.inspect.state import InspectionState

logger = logging.getLogger(__name__)
MAX_RESTARTS = 3  # restarts within RESTART_WINDOW; one more exit there, and the service is given up
RESTART_WINDOW = 60.0  # s
WATCH = 0.25  # s between two looks at the service process (a look is a syscall: a GIL hand-over)
CATCH_UP = 0.05  # s without a publish (the engine stopped stepping) before its unsent records are sent


class InspectionService:
    def __init__(
        self,
        state: InspectionState,
        path: str | os.PathLike,
        *,
        pointer: bool = False,
        limits: ServiceLimits | None = None,
    ) -> None:
        self.state = state
        self.path = Path(path)
        self.limits = limits or ServiceLimits()
        self.restarts = 0
        self._pointer = pointer
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._shut_lock = threading.Lock()
        self._shut_done = False
        self._exits: list[float] = []  # when the service process exited unasked (within RESTART_WINDOW)
        self._listener = listener.listen(self.path)
        self._inode = os.stat(self.path).st_ino
        self._wake_r, self._wake_w = socket.socketpair()
        self._feed: Feed | None = None
        self._proc: subprocess.Popen | None = None
        self._points: socket.socket | None = None
        try:
            self._spawn()
        except OSError as exc:
            self._release()
            raise InspectError(
                f"inspect.socket: cannot start the inspection service process ({exc}); check that "
                f"{sys.executable!r} runs this environment's Python, or set inspect.socket: off"
            ) from None
        state.attach(self._feed)
        if pointer:
            write_pointer(self.path)
        self._thread = threading.Thread(target=self._supervise, name="tiercache-inspect", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a normal exit, Ctrl-C included
        self._finalizer = mp_util.Finalize(None, self.close, exitpriority=10)  # a multiprocessing child
        logger.info(
            "tiercache: inspection service on %s (process %d; tiercache inspect --socket %s)",
            path, self._proc.pid, path,
        )  # fmt: skip

    @classmethod
    def start(cls, config, state: InspectionState, **kwargs) -> InspectionService | None:
        """From an InspectConfig (or its socket string): None for "off"; raises InspectError with the fix
        when the socket or its process cannot be created."""
        setting = getattr(config, "socket", config)
        if setting in ("off", None, False):
            return None
        if setting == "auto":
            return cls(state, auto_socket_path(), pointer=True, **kwargs)
        return cls(state, Path(os.path.expanduser(str(setting))), **kwargs)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        return not self._stop.is_set() and self._thread.is_alive() and self.pid is not None

    def close(self, timeout: float = 2.0) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        atexit.unregister(self.close)
        self._finalizer.cancel()
        if os.getpid() != self._pid:  # a forked child: the process, socket and thread are the parent's
            return
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self._shut(timeout)

    def _give_up(self) -> None:
        """On the engine's thread: the service ends, and the engine goes on."""
        self._stop.set()
        atexit.unregister(self.close)
        self._finalizer.cancel()
        self._shut(self.limits.request_timeout)

    def __enter__(self) -> InspectionService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- the service process
    def _spawn(self) -> None:
        """A service process, with a new feed and point-read channel (the feed's first Update is full)."""
        feed_ours, feed_theirs = socket.socketpair()
        points_ours, points_theirs = socket.socketpair()
        fds = (self._listener.fileno(), feed_theirs.fileno(), points_theirs.fileno())
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable, "-m", "tiercache.inspect.process", "--engine-pid", str(self._pid),
                    "--limits", json.dumps(asdict(self.limits)), "--fds", ",".join(map(str, fds)),
                ],
                pass_fds=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=_child_env(),
            )  # fmt: skip
        except BaseException:
            for s in (feed_ours, points_ours):
                s.close()
            raise
        finally:
            feed_theirs.close()
            points_theirs.close()
        if self._feed is None:
            self._feed = Feed(feed_ours, self.state)
        else:
            self._feed.restart(feed_ours)
        if self._points is not None:
            self._points.close()
        self._points = points_ours

    def _shut(self, timeout: float) -> None:
        with self._shut_lock:
            if self._shut_done:
                return
            self._shut_done = True
            self._end_process(timeout)
            self._release()

    def _end_process(self, timeout: float) -> None:
        if self._feed is not None:
            self.state.detach(self._feed)
            self._feed.close()  # the service process's feed ends: it exits
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning(
                "tiercache: inspection service process %d did not exit in %gs; killed", proc.pid, timeout
            )
            proc.kill()
            proc.wait()

    def _release(self) -> None:
        for s in (self._points, self._listener, self._wake_r, self._wake_w):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:  # still ours, not a newer server's
                self.path.unlink()
        if self._pointer:
            clear_pointer(self.path)

    # ----------------------------------------------------------------- the engine's thread
    def _supervise(self) -> None:
        reads = PointReads(self.state, self.limits)
        looked = time.monotonic()
        try:
            while not self._stop.is_set():
                wait = CATCH_UP if self._feed.behind() else WATCH
                alive = reads.serve(self._points, self._wake_r, self._feed, self._stop, wait)
                self._feed.catch_up(CATCH_UP)
                if alive and time.monotonic() - looked < WATCH:
                    continue
                if not alive:
                    self._stop.wait(0.05)  # its end closed: it is exiting, or has
                looked = time.monotonic()
                if self._proc.poll() is not None and not self._stop.is_set():
                    if not self._restart():
                        return
                    reads.reset()
        except Exception:  # a bug: the engine runs on; say so
            logger.exception("tiercache: inspection service's engine thread failed; the service is closed")
            self._give_up()

    def _restart(self) -> bool:
        """The service process exited unasked: start another, or give up (False) after MAX_RESTARTS."""
        code, pid = self._proc.returncode, self._proc.pid
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        now = time.monotonic()
        self._exits = [t for t in self._exits if now - t < RESTART_WINDOW] + [now]
        if len(self._exits) > MAX_RESTARTS:
            logger.error(
                "tiercache: the inspection service process %d exited (%s), %d times within %gs; not started "
                "again: %s is removed and the engine runs on without it (its log above says why)",
                pid, how, len(self._exits), RESTART_WINDOW, self.path,
            )  # fmt: skip
            self._give_up()
            return False
        logger.warning("tiercache: the inspection service process %d exited (%s); starting another", pid, how)
        try:
            self._spawn()
        except OSError as exc:
            logger.error(
                "tiercache: the inspection service could not be started again (%s); it is closed", exc
            )
            self._give_up()
            return False
        self.restarts += 1
        return True


def _child_env() -> dict[str, str]:
    """This process's environment, with the tiercache it runs first on the path (the service process must
    import the same code, whatever else the interpreter's environment holds)."""
    import tiercache

    root = str(Path(tiercache.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
