"""Where a lab host's CPU comes from: the cgroup mounts, the quota, CPU use as a fraction of the quota."""

from __future__ import annotations

from pescheduler.worker import cgroup

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_mounts_are_found_by_type_and_controller(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(HYBRID)
    assert cgroup.cgroup_mounts(str(info)) == {"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
                                               "v2": "/sys/fs/cgroup/unified"}
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("hugetlb\n")        # v2 without the cpu controller: use v1
    assert cgroup.cpu_hierarchy({"v2": str(unified), "cpu": "a", "cpuacct": "b"}) == "v1"
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    assert cgroup.cpu_hierarchy({"v2": str(unified)}) == "v2"
    assert cgroup.cpu_hierarchy({"v2": str(tmp_path / "none"), "cpu": "a"}) is None


def test_cpu_use_is_a_fraction_of_the_quota(monkeypatch):
    used, now = [0.0], [100.0]
    monkeypatch.setattr(cgroup.time, "monotonic", lambda: now[0])
    half = cgroup.QuotaCPU(lambda: used[0], cores=0.5)
    used[0], now[0] = 0.25, 101.0                    # a quarter core for a second: half the quota
    assert half.fraction() == 0.5
    used[0], now[0] = 1.25, 102.0                    # more than the quota allows (a burst): capped at 1
    assert half.fraction() == 1.0


def test_a_lab_worker_is_told_its_quota(monkeypatch):
    monkeypatch.setenv(cgroup.QUOTA_ENV, "0.5")
    quota = cgroup.host_quota()
    assert quota is not None and quota.cores == 0.5 and 0.0 <= quota.fraction() <= 1.0
