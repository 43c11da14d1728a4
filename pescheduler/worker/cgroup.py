"""Where this process's CPU comes from when a cgroup quota bounds it (a lab host).

A lab host is a cgroup with a CPU quota (``resource_managers/lab_net.py``);
its workers share the machine's ``/proc/stat`` with every other process, so
``psutil.cpu_percent`` would call the host saturated whenever the machine is.
:class:`QuotaCPU` measures what the host really has: the group's CPU time over
its quota (v2 ``cpu.stat``/``cpu.max``, or v1 ``cpuacct.usage`` and
``cpu.cfs_quota_us``). :func:`host_quota` finds the quota of this worker, or
None when no quota bounds it (then the machine's CPU is the host's).
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Callable


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, str]:
    """Where cgroup hierarchies are mounted: ``{"v2": path, "cpu": path, "cpuacct": path}``
    (v1 controllers by name; a co-mounted ``cpu,cpuacct`` appears under both)."""
    found: dict[str, str] = {}
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _src, opts = (right.split() + ["", "", ""])[:3]
            point = left.split()[4]
            if fstype == "cgroup2":
                found.setdefault("v2", point)
            elif fstype == "cgroup":
                for opt in opts.split(","):
                    if opt in ("cpu", "cpuacct"):
                        found.setdefault(opt, point)
    return found


def cpu_hierarchy(mounts: dict[str, str]) -> str | None:
    """``"v2"`` when the cgroup v2 hierarchy offers the cpu controller, ``"v1"`` when the v1
    ``cpu`` and ``cpuacct`` controllers are mounted, else None."""
    v2 = mounts.get("v2")
    if v2:
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as f:
                if "cpu" in f.read().split():
                    return "v2"
        except OSError:
            pass
    return "v1" if "cpu" in mounts and "cpuacct" in mounts else None


class QuotaCPU:
    """CPU use under a quota of ``cores``, as a fraction of it, between calls of :meth:`fraction`;
    ``usage()`` gives the CPU seconds used so far."""

    def __init__(self, usage: Callable[[], float], cores: float) -> None:
        self.usage, self.cores = usage, cores
        self._last = (time.monotonic(), usage())

    def fraction(self) -> float:
        """CPU time used since the last call over what the quota allowed (0..1)."""
        now, used = time.monotonic(), self.usage()
        t0, u0 = self._last
        self._last = (now, used)
        return min(1.0, (used - u0) / max(now - t0, 1e-9) / self.cores)


def _counter(path: str, seconds_per_unit: float) -> Callable[[], float]:
    """CPU seconds from a cgroup file: v2 ``cpu.stat``'s ``usage_usec``, or v1 ``cpuacct.usage`` (ns)."""
    def usage() -> float:
        with open(path) as f:
            text = f.read()
        if path.endswith("cpu.stat"):
            text = next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec"))
        return int(text.split()[0]) * seconds_per_unit
    return usage


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def host_quota() -> QuotaCPU | None:
    """The quota this worker's host gives it: ``PESCHEDULER_CPU_QUOTA`` (cores per worker, set by
    the lab, whose workers cannot see the cgroup files: ``ip netns exec`` mounts a fresh
    ``/sys``), else this process's own cgroup quota, else None."""
    given = os.environ.get(QUOTA_ENV)
    if given:
        return QuotaCPU(_own_cpu_seconds, float(given))
    return own_quota()


QUOTA_ENV = "PESCHEDULER_CPU_QUOTA"


def own_quota(proc_cgroup: str = "/proc/self/cgroup") -> QuotaCPU | None:
    """The quota bounding this process's own cgroup, or None (no quota, or not Linux)."""
    try:
        mounts = cgroup_mounts()
        with open(proc_cgroup) as f:
            groups = {ctrl: path for _h, ctrl, path in (line.rstrip("\n").split(":", 2) for line in f)}
    except (OSError, ValueError):
        return None
    for find in (_v2_quota, _v1_quota):
        try:
            found = find(mounts, groups)
        except (OSError, ValueError, KeyError):
            found = None
        if found is not None:
            return found
    return None


def _v2_quota(mounts: dict[str, str], groups: dict[str, str]) -> QuotaCPU | None:
    where = os.path.join(mounts["v2"], groups[""].lstrip("/"))
    with open(os.path.join(where, "cpu.max")) as f:
        quota, period = f.read().split()[:2]
    return None if quota == "max" else QuotaCPU(_counter(os.path.join(where, "cpu.stat"), 1e-6), int(quota) / int(period))


def _v1_quota(mounts: dict[str, str], groups: dict[str, str]) -> QuotaCPU | None:
    v1 = {c: p for ctrls, p in groups.items() for c in ctrls.split(",") if c in ("cpu", "cpuacct")}
    where = os.path.join(mounts["cpu"], v1["cpu"].lstrip("/"))
    with open(os.path.join(where, "cpu.cfs_quota_us")) as f:
        quota = int(f.read())
    with open(os.path.join(where, "cpu.cfs_period_us")) as f:
        period = int(f.read())
    if quota <= 0:
        return None
    return QuotaCPU(_counter(os.path.join(mounts["cpuacct"], v1["cpuacct"].lstrip("/"), "cpuacct.usage"), 1e-9),
                    quota / period)


CPU_MAX = "/sys/fs/cgroup/cpu.max"


def core_budget(cpu_max: str = CPU_MAX) -> tuple[int, str]:
    """Whole cores this process may use, and where the figure comes from.

    The CPUs of its affinity mask (``os.sched_getaffinity``: taskset, cpusets),
    lowered by a cgroup v2 quota (``cpu.max`` holds ``"quota period"``, or
    ``"max period"`` for none) rounded down, never below one core.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    source = f"{cores} CPUs in the affinity mask"
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return cores, source
    if quota != "max" and float(period) > 0:
        allowed = max(1, math.floor(float(quota) / float(period)))
        if allowed < cores:
            return allowed, f"cgroup quota {quota}/{period} in {cpu_max}"
    return cores, source


def machine_id(boot_id: str = "/proc/sys/kernel/random/boot_id") -> str:
    """Which machine this process runs on, the same inside the lab's network namespaces (they
    share ``/proc``): the kernel's boot id, else the host name. Hosts that are only names for
    processes on one machine (the embedded cluster, the ``local`` manager's hosts) share its
    cores, and the monitor adds up their CPU by it."""
    try:
        with open(boot_id) as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()
