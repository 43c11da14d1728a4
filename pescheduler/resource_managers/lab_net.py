"""The lab's pieces of a host: a bridge, network namespaces on it, cgroup CPU quotas.

Each object here creates what it names and removes exactly that, by name:
:class:`LabNetwork` a bridge ``pslabN`` holding ``10.213.N.1/24`` in this
network namespace; :class:`Namespace` a network namespace ``pslabN-hI``
wired to it by a veth pair (its own address ``10.213.N.(I+1)``, optional
``tc netem`` delay and loss on both ends); :class:`CpuGroup` a cgroup with a
CPU quota (v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us`` plus a ``cpuacct``
group for its usage, whichever the machine mounts). Objects still alive at
interpreter exit are removed then (``atexit``), so a crash in between leaves
nothing behind; nothing is ever removed by a pattern.

A process killed outright (SIGKILL, the OOM killer) runs no ``atexit``. So
each process also keeps a ledger of what it owns in :data:`LEDGER_DIR`
(one file named by its PID and start time), and the next lab to start
removes what the ledgers of dead processes name (:func:`remove_stale`):
their cgroups' processes are killed by PID, then the namespaces, veths,
bridges and cgroups go, each by its recorded name.

The commands are ``ip`` and ``tc`` (iproute2); everything needs root.
:func:`missing` says what of that is absent, so the lab can refuse with a
clear reason instead of half-building a host.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import threading
import time

import psutil

from ..process_start import started
from ..worker.cgroup import cgroup_mounts, cpu_hierarchy

logger = logging.getLogger(__name__)

NETWORKS: dict[str, "LabNetwork"] = {}   # bridge address -> a lab network this process made
_LIVE: dict[int, object] = {}           # id -> object with remove(): what is still ours to remove
_LOCK = threading.Lock()


LEDGER_DIR = "/run/pescheduler-lab"      # one ledger per process: what it owns (tmpfs: gone at boot)


def _own(obj) -> None:
    with _LOCK:
        _LIVE[id(obj)] = obj
        _write_ledger()


def _disown(obj) -> None:
    with _LOCK:
        if _LIVE.pop(id(obj), None) is not None:
            _write_ledger()


def _ledger_path(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return os.path.join(LEDGER_DIR, f"{pid}-{started(pid)}.json")


def _write_ledger() -> None:
    """Record what this process owns (under ``_LOCK``); no ledger once it owns nothing."""
    path = _ledger_path()
    records = [obj.record() for obj in _LIVE.values()]
    if not records:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    os.makedirs(LEDGER_DIR, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(records, f)
    os.replace(path + ".tmp", path)


def _alive(name: str) -> bool:
    """Whether the process a ledger file is named after (``PID-STARTTIME.json``) still runs."""
    pid, _, start = name.removesuffix(".json").partition("-")
    try:
        return started(int(pid)) == start
    except ValueError:
        return False


def remove_stale() -> list[str]:
    """Remove what dead processes' ledgers name; what was removed, for the log and the tests."""
    removed: list[str] = []
    if not os.path.isdir(LEDGER_DIR):
        return removed
    for name in sorted(os.listdir(LEDGER_DIR)):
        if not name.endswith(".json") or _alive(name):
            continue
        path = os.path.join(LEDGER_DIR, name)
        try:
            with open(path) as f:
                records = json.load(f)
        except (OSError, ValueError):
            records = []
        order = {"cgroup": 0, "netns": 1, "bridge": 2}    # stop processes first, the bridge last
        for record in sorted(records, key=lambda r: order.get(r.get("kind"), 3)):
            removed.append(_remove_record(record))
        os.unlink(path)
    if removed:
        logger.warning("lab: removed what killed processes left: %s", ", ".join(removed))
    return removed


def _remove_record(record: dict) -> str:
    kind = record["kind"]
    if kind == "cgroup":
        for d in record["dirs"]:
            with contextlib.suppress(OSError), open(os.path.join(d, "cgroup.procs")) as f:
                for pid in f.read().split():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        psutil.Process(int(pid)).kill()      # a worker of the dead process's lab host
        group = CpuGroup.__new__(CpuGroup)
        group.name, group.dirs = record["name"], record["dirs"]
        group.remove(timeout=10.0)
        return f"cgroup {record['name']}"
    if kind == "netns":
        _quiet("ip", "netns", "del", record["name"])
        _quiet("ip", "link", "del", record["veth"])
        return f"namespace {record['name']}"
    _quiet("ip", "link", "del", record["name"])
    return f"bridge {record['name']}"


@atexit.register
def _remove_leftovers() -> None:
    """At exit, remove what this process created and did not remove (newest first)."""
    for obj in reversed(list(_LIVE.values())):
        try:
            obj.remove()
        except Exception as exc:           # exiting: say it, go on with the rest
            logger.warning("lab: removing %r at exit failed: %s", obj, exc)


@contextlib.contextmanager
def _undo_on_failure(obj):
    """Own ``obj`` (removed at exit unless removed before); a failed create removes what it made."""
    _own(obj)
    try:
        yield
    except BaseException:
        obj.remove()
        raise


def run(*cmd: str) -> str:
    """Run a command; its stdout, or ``RuntimeError`` with its stderr."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


# -- what the lab needs ---------------------------------------------------------------------

def missing(netem: bool) -> list[str]:
    """What the lab needs and this machine lacks (empty: all there)."""
    lacks = []
    if os.geteuid() != 0:
        lacks.append(f"root (running as uid {os.geteuid()}): namespaces and cgroups need it")
    for tool, why in (("ip", "network namespaces"), ("tc", "delay and loss")):
        if (tool == "ip" or netem) and shutil.which(tool) is None:
            lacks.append(f"the `{tool}` command (Debian package iproute2) for {why}")
    if netem and not lacks and not _has_netem():
        lacks.append("netem in this kernel (`tc qdisc ... netem` says the kind is unknown: sch_netem "
                     "is not built in): set pescheduler.rm.lab.delay and loss to 0")
    if cpu_hierarchy(cgroup_mounts()) is None:
        lacks.append("a cgroup CPU controller: neither cgroup v2 with `cpu` in cgroup.controllers "
                     "nor the v1 `cpu` and `cpuacct` hierarchies are mounted")
    return lacks


def _has_netem() -> bool:
    """Whether the kernel has netem: tried on the loopback of a throw-away namespace."""
    probe = f"pslab-probe-{os.getpid()}"
    run("ip", "netns", "add", probe)
    try:
        run("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        return True
    except RuntimeError:
        return False
    finally:
        _quiet("ip", "netns", "del", probe)


# -- the bridge -------------------------------------------------------------------------------

class LabNetwork:
    """A bridge ``pslabN`` with ``10.213.N.1/24`` (the first free ``/24`` of ``subnet``).

    The deployment's scheduler and workers listen on that address, so the lab's
    namespaces reach them; no other machine does (the bridge has no port to
    the outside).
    """

    def __init__(self, subnet: str) -> None:
        self.subnet = ipaddress.ip_network(subnet)
        self.index, self.net, self.name, self.address = -1, None, "", ""
        self.hosts = 0

    def _candidates(self):
        """``(N, /24)`` of ``subnet`` that no interface here has an address in, nor a ``pslabN``."""
        used = {ipaddress.ip_address(a.address) for addrs in psutil.net_if_addrs().values()
                for a in addrs if a.family.name == "AF_INET"}
        links = set(psutil.net_if_addrs())
        for i, net in enumerate(self.subnet.subnets(new_prefix=24)):
            if not any(u in net for u in used) and f"pslab{i}" not in links:
                yield i, net

    def create(self) -> "LabNetwork":
        """Claim the first free ``/24``: adding the link ``pslabN`` is the claim (the kernel adds a
        name once), so two deployments starting a lab at the same moment take different ones, and
        a lost claim never removes the bridge the other one made."""
        remove_stale()
        for i, net in self._candidates():
            try:
                run("ip", "link", "add", f"pslab{i}", "type", "bridge")
            except RuntimeError as exc:
                if "exists" in str(exc):
                    continue                        # another lab took it since we looked
                raise
            self.index, self.net, self.name = i, net, f"pslab{i}"
            self.address = str(net.network_address + 1)
            with _undo_on_failure(self):
                run("ip", "addr", "add", f"{self.address}/24", "dev", self.name)
                run("ip", "link", "set", self.name, "up")
                NETWORKS[self.address] = self
            return self
        raise RuntimeError(f"lab: no free /24 left in {self.subnet}")

    def record(self) -> dict:
        return {"kind": "bridge", "name": self.name}

    def next_address(self) -> str:
        """The next host's address on the bridge (``.2``, ``.3``, ...)."""
        self.hosts += 1
        if self.hosts + 1 >= self.net.num_addresses - 1:
            raise RuntimeError(f"lab: no address left on {self.net}")
        return str(self.net.network_address + 1 + self.hosts)

    def remove(self) -> None:
        _disown(self)
        NETWORKS.pop(self.address, None)
        _quiet("ip", "link", "del", self.name)

    def __repr__(self) -> str:
        return f"LabNetwork({self.name}, {self.address}/24)"


def _quiet(*cmd: str) -> None:
    """Run a removal; one whose target is already gone is not an error."""
    try:
        run(*cmd)
    except RuntimeError as exc:
        if "Cannot find" not in str(exc) and "No such" not in str(exc) and "not exist" not in str(exc):
            logger.warning("lab: %s", exc)


# -- a host's namespace ------------------------------------------------------------------------------

class Namespace:
    """A network namespace on the lab bridge: veth ``<bridge>h<I>`` to the bridge, ``eth0``
    inside with ``address``; ``delay_ms``/``loss_pct`` as netem on both ends (each way)."""

    def __init__(self, network: LabNetwork, index: int, address: str,
                 delay_ms: float = 0.0, loss_pct: float = 0.0) -> None:
        self.name = f"{network.name}-h{index}"
        self.veth = f"{network.name}h{index}"
        self.bridge = network.name
        self.address = address
        self.delay_ms, self.loss_pct = delay_ms, loss_pct

    def create(self) -> "Namespace":
        with _undo_on_failure(self):
            self._create()
        return self

    def _create(self) -> None:
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        run("ip", "link", "set", self.veth, "master", self.bridge, "up")
        run("ip", "-n", self.name, "addr", "add", f"{self.address}/24", "dev", "eth0")
        run("ip", "-n", self.name, "link", "set", "eth0", "up")
        run("ip", "-n", self.name, "link", "set", "lo", "up")
        if self.delay_ms or self.loss_pct:
            netem = ["netem", "delay", f"{self.delay_ms}ms", "loss", f"{self.loss_pct}%"]
            run("tc", "qdisc", "add", "dev", self.veth, "root", *netem)
            run("tc", "-n", self.name, "qdisc", "add", "dev", "eth0", "root", *netem)

    def record(self) -> dict:
        return {"kind": "netns", "name": self.name, "veth": self.veth}

    def command(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace (``ip netns exec`` execs it: the PID stays the same)."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def exists(self) -> bool:
        return self.name in run("ip", "netns", "list").split()

    def remove(self) -> None:
        """Delete the namespace (its ``eth0`` and so the veth pair go with it)."""
        _disown(self)
        _quiet("ip", "netns", "del", self.name)
        _quiet("ip", "link", "del", self.veth)       # normally gone with its peer already

    def __repr__(self) -> str:
        return f"Namespace({self.name}, {self.address})"


# -- a host's CPU quota --------------------------------------------------------------------------------

class CpuGroup:
    """A cgroup named ``name`` whose processes share ``cores`` of CPU time (a quota per period).

    The quota caps the group; its weight (``WEIGHT_TASKS`` times a plain
    task's) puts it first in line up to that cap, so a lab host gets its
    quota while the machine is loaded, as a real host has its own cores.
    Without the weight the group counts as one task against every other
    runnable one: measured at a load average of 29 on this 2-core machine
    (cgroup v1), a spinning process under a 0.5-core quota got 0.20 of a
    core with the default weight and 0.50 with this one; sizing by the hosts'
    quotas measured the machine's load instead (issue 15).
    """

    PERIOD_US = 100_000
    WEIGHT_TASKS = 100

    def __init__(self, name: str, cores: float) -> None:
        self.name, self.cores = name, float(cores)
        mounts = cgroup_mounts()
        self.kind = cpu_hierarchy(mounts)
        if self.kind is None:
            raise RuntimeError("lab: no cgroup CPU controller mounted")
        roots = [mounts["v2"]] if self.kind == "v2" else list(dict.fromkeys([mounts["cpu"], mounts["cpuacct"]]))
        self.dirs = [os.path.join(root, name) for root in roots]

    def create(self) -> "CpuGroup":
        with _undo_on_failure(self):
            self._create()
        return self

    def _create(self) -> None:
        quota = max(1000, int(self.cores * self.PERIOD_US))
        for d in self.dirs:
            os.mkdir(d)
        if self.kind == "v2":
            _write(os.path.join(self.dirs[0], "cpu.max"), f"{quota} {self.PERIOD_US}")
            _write(os.path.join(self.dirs[0], "cpu.weight"), str(100 * self.WEIGHT_TASKS))   # a task: 100
        else:
            _write(os.path.join(self.dirs[0], "cpu.cfs_period_us"), str(self.PERIOD_US))
            _write(os.path.join(self.dirs[0], "cpu.cfs_quota_us"), str(quota))
            _write(os.path.join(self.dirs[0], "cpu.shares"), str(1024 * self.WEIGHT_TASKS))  # a task: 1024

    def record(self) -> dict:
        return {"kind": "cgroup", "name": self.name, "dirs": self.dirs}

    def add(self, pid: int) -> None:
        """Put process ``pid`` (and so the children it starts later) in the group."""
        for d in self.dirs:
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def pids(self) -> list[int]:
        with open(os.path.join(self.dirs[0], "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]

    def exists(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs)

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the group once its processes have gone (they were stopped by PID first)."""
        _disown(self)
        deadline = time.monotonic() + timeout
        for d in self.dirs:
            while os.path.isdir(d):
                try:
                    os.rmdir(d)
                except OSError as exc:      # EBUSY while an exiting process is still counted
                    if time.monotonic() >= deadline:
                        logger.warning("lab: cannot remove cgroup %s: %s", d, exc)
                        break
                    time.sleep(0.05)        # bounded; no event says "the group is empty"

    def __repr__(self) -> str:
        return f"CpuGroup({self.name}, {self.cores} cores, {self.kind})"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
