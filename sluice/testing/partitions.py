"""Network partitions between the processes of a LocalCluster, with iptables on loopback.

Every process of a LocalCluster listens on 127.0.0.1, so addresses cannot tell them apart; the
kernel's ``owner`` match can, for locally generated packets, by the *group id* of the socket's
owner. :class:`NetworkPartitions` therefore starts each process under a group id of its own and
cuts traffic between two groups with DROP rules:

* **Group ids.** ``LocalCluster(python=partitions.python)`` starts every process through a small
  wrapper executable written by this class: it reads which process it is from the command line
  (``-m sluice.broker ... --id N``: group ``gid_base + N``; the local controller: ``gid_base +
  CONTROLLER``; any process whose environment sets ``SLUICE_TEST_GID``: that group, e.g. an
  operator replica of the Kubernetes tests), drops every supplementary group, sets real,
  effective and saved group ids, and execs the real interpreter. The user id stays root, so
  files are reached as before. Changing credentials clears the parent-death signal
  LocalCluster's launcher set, so the wrapper sets it again (and exits if its parent is already
  gone): brokers still die with a crashed test.
* **Rules.** All in one chain of this harness (``SLUICE-<pid>``), jumped to from ``OUTPUT -o lo
  -p tcp``. Cutting brokers A and B drops packets of group A to B's port and of group B to A's
  port; dropping the request direction of each flow stalls the replies too, and DROP (not
  REJECT) is what a partition looks like: connections hang until they time out. Cutting the
  controller from a broker drops the controller's health checks to it. Clients (the test
  process, group 0) are never cut: a leader cut off from its followers and the controller is
  still reachable by clients, the case a minority leader must not acknowledge writes in.
* **Healing and cleanup.** ``heal()`` flushes the chain; ``close()`` (also ``__exit__``) flushes
  it, removes the jump and deletes the chain, so a failed test leaves no rule behind.
  ``dropped_packets()`` reads the chain's counters; ``connects(gid, port)`` tries a TCP connect
  as a process of that group, to check that a cut took effect before trusting a result.

What this cannot cut in local mode: the metadata store is a SQLite file every process opens, so
a partitioned broker still reads the cluster's metadata (it learns it was deposed) and can still
compare-and-set an ISR; leaders only do that while the document names them at their epoch.
Needs root (group ids, iptables) and ``iptables`` installed (``apt-get install -y iptables``).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

__all__ = ["CONTROLLER", "NetworkPartitions", "PartitionError"]

CONTROLLER = 999  # the local controller's group is gid_base + CONTROLLER
DEFAULT_GID_BASE = 47000
_CONNECT = """\
import os, socket, sys
gid, host, port, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if gid:
    os.setgroups([]); os.setresgid(gid, gid, gid)
try:
    socket.create_connection((host, port), timeout=timeout).close()
except OSError:
    sys.exit(3)
"""


class PartitionError(RuntimeError):
    """The harness cannot work here (not root, no iptables) or an iptables command failed."""


def _wrapper_source(interpreter: str, gid_base: int, parent_pid: int) -> str:
    return f"""#!{interpreter} -IS
# Written by sluice.testing.partitions: run a LocalCluster process under a group id of its own.
import ctypes, os, sys
args = sys.argv[1:]
gid = None
if os.environ.get("SLUICE_TEST_GID"):
    gid = int(os.environ["SLUICE_TEST_GID"])
elif "sluice.broker" in args and "--id" in args:
    gid = {gid_base} + int(args[args.index("--id") + 1])
elif "sluice.operator.controller.local" in args:
    gid = {gid_base} + {CONTROLLER}
if gid is not None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    # a credential change clears the parent-death signal: set it again (PR_SET_PDEATHSIG, SIGKILL)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, 9, 0, 0, 0) != 0:
        sys.exit("gid wrapper: prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != {parent_pid}:
        os._exit(1)
os.execv({interpreter!r}, [{interpreter!r}, *args])
"""


class NetworkPartitions:
    """Cuts between LocalCluster processes (see the module docstring). Use as a context manager."""

    def __init__(self, work_dir: str | os.PathLike[str], *, gid_base: int = DEFAULT_GID_BASE) -> None:
        if os.geteuid() != 0:
            raise PartitionError("network partitions need root (group ids and iptables)")
        iptables = shutil.which("iptables")
        if iptables is None:
            raise PartitionError("iptables is not installed (apt-get install -y iptables)")
        self.iptables = iptables
        self.gid_base = gid_base
        self.chain = f"SLUICE-{os.getpid()}"
        self._jump = ["OUTPUT", "-o", "lo", "-p", "tcp", "-j", self.chain]
        self._installed = False
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        self.python = str(work / "sluice-gid-python")
        Path(self.python).write_text(_wrapper_source(sys.executable, gid_base, os.getpid()))
        os.chmod(self.python, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)

    # -- set-up and clean-up --------------------------------------------------------------------

    def _run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([self.iptables, "-w", "5", *args], capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise PartitionError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def install(self) -> NetworkPartitions:
        """Create the chain and the jump to it (idempotent)."""
        if not self._installed:
            self._run("-N", self.chain, check=False)  # may exist from a crashed run of this pid
            self._run("-F", self.chain)
            self._run("-I", *self._jump)
            self._installed = True
        return self

    def close(self) -> None:
        """Remove every rule of this harness: the chain's rules, the jump, the chain."""
        if not self._installed:
            return
        self._run("-F", self.chain, check=False)
        for _ in range(10):  # every copy of the jump, bounded
            if subprocess.run([self.iptables, "-w", "5", "-D", *self._jump], capture_output=True).returncode != 0:
                break
        self._run("-X", self.chain, check=False)
        self._installed = False

    def __enter__(self) -> NetworkPartitions:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- who is who -----------------------------------------------------------------------------

    def broker_gid(self, broker_id: int) -> int:
        return self.gid_base + broker_id

    @property
    def controller_gid(self) -> int:
        return self.gid_base + CONTROLLER

    # -- cuts -----------------------------------------------------------------------------------

    def _drop(self, gid: int, port: int) -> None:
        self._run("-A", self.chain, "-m", "owner", "--gid-owner", str(gid), "-p", "tcp", "--dport", str(port),
                  "-j", "DROP")  # fmt: skip

    def cut_port(self, gid: int, port: int) -> None:
        """Cut the processes of group ``gid`` from a loopback TCP ``port`` (a Kubernetes API server's, say)."""
        self.install()
        self._drop(gid, port)

    def cut_brokers(self, a: tuple[int, ...], b: tuple[int, ...]) -> None:
        """Cut broker ``a`` = (id, port, ...) from broker ``b`` in both directions.

        Every port after the id is cut: the client port and the inter-broker listener's (where
        replication and markers flow), so give both.
        """
        self.install()
        for port in b[1:]:
            self._drop(self.broker_gid(a[0]), port)
        for port in a[1:]:
            self._drop(self.broker_gid(b[0]), port)

    def cut_controller(self, broker: tuple[int, ...]) -> None:
        """Cut the local controller's health checks to ``broker`` = (id, port, ...)."""
        self.install()
        for port in broker[1:]:
            self._drop(self.controller_gid, port)

    def isolate(self, broker: tuple[int, ...], others: Iterable[tuple[int, ...]], *, controller: bool = True) -> None:
        """Cut ``broker`` from every one of ``others`` (and from the controller): clients still reach it."""
        for other in others:
            if other[0] != broker[0]:
                self.cut_brokers(broker, other)
        if controller:
            self.cut_controller(broker)

    def heal(self) -> None:
        """Remove every cut (the chain stays, empty)."""
        if self._installed:
            self._run("-F", self.chain)
            self._run("-Z", self.chain, check=False)

    # -- checks ---------------------------------------------------------------------------------

    def rules(self) -> int:
        """How many cuts (DROP rules) are in place."""
        if not self._installed:
            return 0
        return sum(1 for line in self._run("-S", self.chain).splitlines() if line.startswith("-A "))

    def dropped_packets(self, gids: Iterable[int] | None = None) -> int:
        """Packets the chain's rules dropped since the last heal or zeroing (the cut really cut something).

        ``gids``: count only the rules of these groups' traffic, e.g. the cluster's own, leaving
        out the rules a probe of the test (:meth:`connects` as a broker's group) also hits.
        """
        if not self._installed:
            return 0
        wanted = None if gids is None else {str(g) for g in gids}
        total = 0
        for line in self._run("-L", self.chain, "-v", "-n", "-x").splitlines()[2:]:
            fields = line.split()
            if not fields or not fields[0].isdigit():
                continue
            if wanted is not None:
                gid = fields[fields.index("match") + 1] if "match" in fields else None
                if gid not in wanted:
                    continue
            total += int(fields[0])
        return total

    def zero_counters(self) -> None:
        """Reset the chain's packet counters (after a check of its own that was meant to be dropped)."""
        if self._installed:
            self._run("-Z", self.chain)

    @staticmethod
    def process_gid(pid: int) -> int:
        """The effective group id of a running process (from /proc): shows the wrapper did its work."""
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Gid:"):
                return int(line.split()[2])
        raise PartitionError(f"no Gid line in /proc/{pid}/status")

    def connects(self, gid: int, host: str, port: int, timeout: float = 1.5) -> bool:
        """Whether a process of group ``gid`` (0: the test's own group) can open a TCP connection to host:port."""
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CONNECT, str(gid), host, str(port), str(timeout)],
            capture_output=True,
            timeout=timeout + 30,
        )
        return done.returncode == 0
