"""The ``lab`` resource manager: a borrowed host is a network namespace with a CPU quota and a real worker.

Needs root, iproute2 and a cgroup CPU controller (CI runs as root here): a
borrowed host's worker runs inside its namespace (``ip netns identify``) and
cgroup, listens on the namespace's address, a copy placed there processes
tuples, and returning the host leaves no namespace, cgroup or process behind;
the output is every event once up to the drained stop.
"""

from __future__ import annotations

import json
import os
import subprocess

import dask.config
import pytest

import pescheduler
from pescheduler import Application, Replicate
from pescheduler.actions import BorrowHosts, ReturnHost
from tests.waiting import gone, until

pytestmark = [pytest.mark.integration, pytest.mark.lab]

T0 = 1_700_000_000_000           # the generator's first event time; event i has T0 + i (ms)


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _app(out) -> Application:
    app = Application("lab")
    (app.source("generator", events=None, keys=1_000, seed=3, rate=4_000, start_ts=T0)
        .map(lambda e: {"car": e["car"], "ts": e["ts"], "speed": e["speed"] * 2}, id="hot")
        .sink("jsonl", path=str(out)))
    return app


def test_a_borrowed_lab_host_is_a_namespace_with_a_quota_a_copy_runs_there_and_returning_removes_it(tmp_path):
    log, out = tmp_path / "decisions.jsonl", tmp_path / "out.jsonl"
    with dask.config.set({"pescheduler.policies.decision-log": str(log), "pescheduler.rm.lab.cpu": 0.5}):
        with pescheduler.deploy(_app(out), workers=2, rm="lab", policies=[]) as dep:
            bridge = dep._network
            assert dep.scheduler_address.startswith(f"tcp://{bridge.address}:")
            rec = dep.apply(BorrowHosts(1), timeout=120)
            assert rec.applied, rec.reason
            host = dep.hosts.borrowed["lab-1"]
            ns, address, cgroup = host.info["namespace"], host.info["address"], host.info["cgroup"]
            (pid,) = host.info["pids"]
            assert ns in _ip("netns", "list").split()
            assert _ip("netns", "identify", str(pid)).split() == [ns]          # the worker runs inside it
            held = dep.hosts.rm.held["lab-1"]
            assert pid in held.group.pids() and held.group.cores == 0.5
            quota = _quota(held.group)
            assert quota == 0.5, quota
            assert host.workers[0].startswith(f"tcp://{address}:")            # and listens on its address

            rec = dep.apply(Replicate("hot", 1, hosts=("lab-1",)))
            assert rec.applied, rec.reason
            copy = dep.placement().pes["hot#1"]
            assert copy.host == "lab-1" and copy.worker == host.workers[0]
            until(lambda: "hot#1" in dep.activations(), 60, "the copy's first batch, seen by the monitor")

            rec = dep.apply(ReturnHost("lab-1"), timeout=120)
            assert rec.applied, rec.reason
            assert all(pe.host != "lab-1" for pe in dep.placement().pes.values())
            gone([pid], 30, "the lab host's worker")
            assert ns not in _ip("netns", "list").split()
            assert not held.group.exists() and not held.namespace.exists()
            activation = dep.activations()["hot#1"]
            assert activation > 0
            status = dep.stop()
            assert status["state"] == "stopped", status["error"]
            assert not [e for e in status["events"] if "drain did not finish" in e["text"]], status["events"]
        assert bridge.name not in _ip("-br", "link")                        # the bridge went with the cluster
    ts = sorted(json.loads(line)["ts"] for line in out.read_text().splitlines())
    assert ts and ts == list(range(T0, T0 + len(ts)))            # a prefix of the stream: none lost or doubled
    events = [json.loads(line) for line in log.read_text().splitlines()]
    hosts = [(e["outcome"], e["target"]) for e in events if e["kind"] == "host"]
    assert hosts == [("borrowed", "lab-1"), ("returned", "lab-1")], hosts
    activations = [(e["outcome"], e["target"], e["figures"]["ms"]) for e in events if e["kind"] == "activation"]
    assert activations == [("activated", "hot#1", round(activation, 1))]
    assert events[0]["kind"] == "host" and events[0]["figures"]["took_s"] > 0


def _quota(group) -> float:
    """The group's CPU quota in cores, as the kernel holds it."""
    d = group.dirs[0]
    if group.kind == "v2":
        quota, period = open(os.path.join(d, "cpu.max")).read().split()
    else:
        quota, period = (open(os.path.join(d, f)).read() for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    return int(quota) / int(period)


def test_the_lab_says_what_it_lacks_instead_of_half_building_a_host():
    from pescheduler.resource_managers import lab_net

    assert lab_net.missing(netem=False) == []                          # root, ip, a cgroup CPU controller here
    lacks = lab_net.missing(netem=True)
    assert lacks == [] or lacks == ["netem in this kernel (`tc qdisc ... netem` says the kind is unknown: "
                                    "sch_netem is not built in): set pescheduler.rm.lab.delay and loss to 0"]


def test_a_lab_host_joins_a_tls_cluster_over_tls(tmp_path):
    """Issue 19: on a TLS cluster the lab's own client and the workers it starts inside the
    namespace take the deployment's certificates; the sink moved there streams exactly."""
    from guarded import assert_drained, assert_exact, running_app, sink_on_a_borrowed_tls_host

    out = tmp_path / "o.jsonl"
    with dask.config.set({"pescheduler.rm.lab.cpu": 0.5}):
        with pescheduler.deploy(running_app(out), workers=2, rm="lab", security=True,
                                plugins=["support_ops"], policies=[]) as dep:
            assert dep.scheduler_address.startswith(f"tls://{dep._network.address}:")
            until(lambda: dep.resources().lendable >= 1, 60, "the lab manager to reach the TLS scheduler")
            worker = sink_on_a_borrowed_tls_host(dep, 60)
            assert worker.startswith(f"tls://{dep.hosts.borrowed['lab-1'].info['address']}:")
            assert_drained(dep.stop())
    assert assert_exact(out) > 0


def test_two_labs_claiming_the_same_free_subnet_at_once_take_different_bridges():
    from pescheduler.resource_managers import lab_net

    first = lab_net.LabNetwork("10.213.0.0/16").create()
    try:
        class Stale(lab_net.LabNetwork):
            """Looked for a free /24 before ``first`` was made: offers first's index first."""

            def _candidates(self):
                yield first.index, first.net
                yield from super()._candidates()

        second = Stale("10.213.0.0/16").create()
        try:
            assert second.name != first.name and second.address != first.address
            assert first.name in _ip("link", "show", first.name)       # the lost claim removed nothing
            assert first.address in _ip("addr", "show", first.name)
        finally:
            second.remove()
        assert second.name not in _ip("-o", "link", "show")
    finally:
        first.remove()
