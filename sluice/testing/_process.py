"""Child processes of an embedded cluster: start, signal, stop, and never leak.

A test run that crashes, is interrupted or is killed must not leave brokers
behind holding ports and RocksDB locks. Three layers make sure of it:

1. ``close()``/``stop()`` of the owner: SIGTERM, a bounded wait, then SIGKILL.
2. A ``weakref.finalize`` per owner (runs at interpreter exit and when the
   owner is garbage-collected) for owners that were never closed.
3. On Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child before exec:
   the kernel kills the child when its parent dies, even by SIGKILL, when no
   Python code runs at all.

The prctl is made by a tiny launcher (``python -I -S -c ... argv``) that
then execs the real command, not by a ``preexec_fn``: a preexec_fn forces a
real fork() of this process, which runs gRPC's fork handlers, and a parent
with live gRPC channels (every test process) then sometimes gets a child
whose gRPC poller threads crash it before it ever reaches exec. Without a
preexec_fn, subprocess uses vfork, which runs no fork handlers. The launcher
costs one bare interpreter start-up (about 20 ms).

PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the
process. A test that restarts a broker from a short-lived worker thread would
otherwise see that broker die when the thread ends. So every child is forked
from one long-lived daemon thread (:class:`_Spawner`), which lives exactly as
long as the process.

Children get their own session (``start_new_session``): a Ctrl-C in the
terminal reaches only the parent, which then shuts the children down in order
instead of having every process race to handle SIGINT.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


# argv[1]: the parent's pid; argv[2:]: the command. Resolves nothing it does not need (-I -S).
_LAUNCHER = """\
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
if libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
    sys.exit("sluice launcher: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):  # the parent died before the prctl: nobody would signal us
    os._exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _with_deathsig(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the launcher that makes it die with this process (Linux); else ``argv`` as it is."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]


class _Spawner:
    """Runs callables on one long-lived daemon thread (see the module docstring)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sluice-spawner", daemon=True)
                self._thread.start()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((fn, fut))
        return fut.result()

    def _run(self) -> None:
        while True:
            fn, fut = self._queue.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)


_SPAWNER = _Spawner()


class ManagedProcess:
    """One child process with its log file; restartable with the same command line.

    ``state`` is one of: ``new``, ``running``, ``paused``, ``stopped`` (by
    :meth:`stop`), ``killed`` (by :meth:`kill`) or ``exited`` (on its own).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self._state = "new"
        self.starts = 0

    # -- state ---------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    @property
    def state(self) -> str:
        if self._state in ("running", "paused") and self.proc is not None and self.proc.poll() is not None:
            self._state = "exited"
        return self._state

    def is_alive(self) -> bool:
        return self.state in ("running", "paused")

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self.is_alive():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"\n===== {stamp} starting {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            argv = _with_deathsig(self.argv) if self.die_with_parent else self.argv

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    close_fds=True,
                )

            self.proc = _SPAWNER.call(spawn) if self.die_with_parent else spawn()
        self._state = "running"
        self.starts += 1

    def _signal(self, sig: int) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            return False
        return True

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL and reap."""
        if self._signal(signal.SIGKILL):
            self._wait(timeout)
        if self.proc is not None:
            self._state = "killed"

    def pause(self) -> None:
        if self.state != "running":
            raise RuntimeError(f"{self.name} is not running (state {self.state})")
        self._signal(signal.SIGSTOP)
        self._state = "paused"

    def resume(self) -> None:
        if self.state != "paused":
            raise RuntimeError(f"{self.name} is not paused (state {self.state})")
        self._signal(signal.SIGCONT)
        self._state = "running"

    def terminate(self) -> None:
        """Send SIGTERM (and SIGCONT, so that a paused process gets to handle it). Does not wait."""
        if self._signal(signal.SIGTERM):
            self._signal(signal.SIGCONT)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s for a clean exit, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        self.terminate()
        if not self._wait(timeout):
            self._signal(signal.SIGKILL)
            self._wait(10.0)
            self._state = "killed"
        elif self._state != "killed":
            self._state = "stopped"
        return self.proc.poll()

    def _wait(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def log_tail(self, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
        """The last ``lines`` lines of the log file ('' if there is none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.pid} state={self.state}>"


def stop_all(processes: Sequence[ManagedProcess], timeout: float = 20.0) -> None:
    """Stop processes in parallel: SIGTERM to all, one shared deadline, then SIGKILL the rest."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + timeout
    for p in processes:
        p.stop(timeout=deadline - time.monotonic())
