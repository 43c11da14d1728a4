"""Borrowing and returning hosts with the local resource manager, on a real Dask cluster.

The local RM's hosts are real ``dask worker`` processes; its demand schedule
plays the other users of the cluster. Every stream here is checked exactly
(order, nothing lost or doubled) against what the source produced.
"""

from __future__ import annotations

import asyncio
import threading

import dask
import psutil
import pytest

import pescheduler
from pescheduler import Application, BorrowHosts, Move, ReturnHost
from pescheduler.resources import ResourceManagerUnavailable
import guarded
from waiting import until

pytestmark = pytest.mark.integration

WAIT = 120          # seconds: a bound on every wait
DEMO = {"pescheduler.rm.local.oversubscribe": True}   # hosts beyond this 2-core machine's cores: a demo


@pytest.fixture(autouse=True)
def no_policies():
    """Actions here are applied by hand: no policy reconfigures the app behind the test's back."""
    with dask.config.set({"pescheduler.policies.default": []}):
        yield


def numbers_app(path, count, rate, release=None):
    """``release``: a file path; the stream stops at half ``count`` until it exists (``let_finish``),
    so the test's steps (borrow a host, move onto it) happen while it runs however loaded the machine."""
    app = Application("hosts")
    held = {"hold_at": count // 2, "release": str(release)} if release else {}
    (app.source("numbers", count=count, keys=7, rate=rate, **held)
        .apply("tag").key_by("key").apply("running_sum").sink("jsonl", path=str(path)))
    return app


def assert_exact(path, count):
    assert guarded.assert_exact(path) == count


def let_finish(release):
    release.write_text("")


def sink_pe(dep):
    return next(p for p, pe in dep.placement().pes.items() if "jsonl-5" in pe.operators)


def pids_of(host):
    return host.info.get("pids", [])


def test_a_host_asked_back_by_the_other_user_is_returned_before_its_deadline(tmp_path, request):
    """The other user (a demand callable, as a schedule's ``want`` entry calls it) wants the host
    back once the sink runs there, within 10 s: it is returned in time, the sink moved home."""
    moved = threading.Event()
    request.addfinalizer(moved.set)                    # a failed test leaves no thread waiting

    async def other_user(control):
        if await asyncio.to_thread(moved.wait, WAIT):
            await control.want(1, within=10)

    out, count, release = tmp_path / "out.jsonl", 30_000, tmp_path / "release"
    with dask.config.set({**DEMO, "pescheduler.rm.local.hosts": 1, "pescheduler.rm.local.demand": other_user}):
        with pescheduler.deploy(numbers_app(out, count, rate=2_500, release=release), workers=2, rm="local",
                                plugins=["support_ops"], policies=[]) as dep:
            assert dep.apply(BorrowHosts(1, reason="test"), timeout=WAIT).applied
            host = dep.hosts.borrowed["local-1"]
            assert dep.apply(Move(sink_pe(dep), host.workers[0])).applied
            assert dep.placement().pes[sink_pe(dep)].host == "local-1"
            let_finish(release)                        # the stream flows on while the host is returned
            moved.set()
            until(lambda: any(isinstance(r.action, ReturnHost) for r in dep.records()), 30,
                  "local-1 to be returned")
            returned = next(r for r in dep.records() if isinstance(r.action, ReturnHost))
            assert returned.applied and "before its deadline" in returned.reason, returned
            assert dep.placement().pes[sink_pe(dep)].host != "local-1"
            assert "local-1" not in dep.placement().hosts.values()
            assert dep.resources().lendable == 0                   # still wanted by the other user
            let_finish(release)
            dep.wait(timeout=WAIT)
    done = next(e for e in dep.hosts.timeline if e["what"] == "returned")
    assert done["late_s"] < 0
    assert not [p for p in pids_of(host) if psutil.pid_exists(p)]
    assert_exact(out, count)


def test_a_host_freed_by_the_schedule_is_borrowed_and_processes_tuples(tmp_path):
    demand = [{"at": 0, "want": 1, "within": 5}, {"at": 3, "free": 1}]
    out, count, release = tmp_path / "out.jsonl", 30_000, tmp_path / "release"
    with dask.config.set({**DEMO, "pescheduler.rm.local.hosts": 1, "pescheduler.rm.local.demand": demand}):
        with pescheduler.deploy(numbers_app(out, count, rate=3_000, release=release), workers=2, rm="local",
                                plugins=["support_ops"], policies=[]) as dep:
            refused = dep.apply(BorrowHosts(1))
            assert not refused.applied and "granted no host" in refused.reason
            until(lambda: dep.resources().lendable == 1, 20, "local-1 to become lendable")
            assert dep.apply(BorrowHosts(1), timeout=WAIT).applied
            worker = dep.hosts.borrowed["local-1"].workers[0]
            assert worker in dep.placement().workers and dep.resources().borrowed == ("local-1",)
            pe = sink_pe(dep)
            assert dep.apply(Move(pe, worker)).applied

            def processing_there():
                m = dep.next_snapshot(timeout=10).pes.get(pe)
                return m is not None and m.worker == worker and m.host == "local-1" and m.tuples_in_per_s > 0
            let_finish(release)                       # the second half flows through local-1
            until(processing_there, 30, f"{pe} to process tuples on local-1")
            host = dep.hosts.borrowed["local-1"]
            dep.wait(timeout=WAIT)
    assert not [p for p in pids_of(host) if psutil.pid_exists(p)]          # closed with the deployment
    assert_exact(out, count)


class UnreachableRM:
    name = "unreachable"

    def __init__(self, scheduler_address, settings):
        pass

    async def start(self, on_event):
        raise ResourceManagerUnavailable("unreachable: connection refused by rm.example:7077")

    async def close(self):
        pass


class RefusingRM(UnreachableRM):
    name = "refusing"

    async def start(self, on_event):
        pass

    def lendable(self):
        return 3

    async def request_hosts(self, n):
        raise ConnectionResetError("the cluster manager hung up")


@pytest.mark.parametrize("rm, refusal", [("unreachable", "connection refused by rm.example:7077"),
                                         ("refusing", "the cluster manager hung up")])
def test_an_unreachable_or_refusing_manager_never_stops_the_app(tmp_path, monkeypatch, rm, refusal):
    from pescheduler.plugins import active_plugins

    monkeypatch.setitem(active_plugins().resource_managers, "unreachable", UnreachableRM)
    monkeypatch.setitem(active_plugins().resource_managers, "refusing", RefusingRM)
    out, count = tmp_path / "out.jsonl", 5_000
    with pescheduler.deploy(numbers_app(out, count, rate=2_500), workers=2, rm=rm,
                            plugins=["support_ops"], policies=[]) as dep:
        record = dep.apply(BorrowHosts(1), timeout=WAIT)
        assert not record.applied and refusal in record.reason
        assert not dep.apply(ReturnHost("127.0.0.1")).applied          # a host it holds but did not borrow
        status = dep.wait(timeout=WAIT)
    assert status["state"] == "finished"
    if rm == "unreachable":
        assert any(e["kind"] == "rm-unavailable" and refusal in e["text"] for e in status["events"])
    assert_exact(out, count)


def kill_host(host):
    """Simulate a crash of the host: its worker processes die (by the PIDs the RM recorded)."""
    for pid in pids_of(host):
        psutil.Process(pid).kill()


def test_a_lost_host_is_a_clear_error_failing_the_app_only_if_its_pes_ran_there(tmp_path):
    out, count = tmp_path / "out.jsonl", 20_000
    with dask.config.set({**DEMO, "pescheduler.rm.local.hosts": 2}):
        with pescheduler.deploy(numbers_app(out, count, rate=2_500, release=tmp_path / "never"), workers=2, rm="local",
                                plugins=["support_ops"]) as dep:
            assert dep.apply(BorrowHosts(2), timeout=WAIT).applied
            empty, used = (dep.hosts.borrowed[h] for h in ("local-1", "local-2"))
            assert dep.apply(Move(sink_pe(dep), used.workers[0])).applied
            kill_host(empty)
            until(lambda: "local-1" not in dep.resources().borrowed, 30, "local-1 to be reported lost")
            assert dep.status()["state"] == "running"
            assert empty.workers[0] not in dep.placement().workers
            kill_host(used)
            with pytest.raises(pescheduler.DeploymentFailed, match="host local-2 lost.*ran there"):
                dep.wait(timeout=WAIT)
        lost = [e["text"] for e in dep.status()["events"] if e["kind"] == "host-lost"]
    assert lost[0].startswith("host local-1 lost: worker") and "its PEs" not in lost[0]
    assert f"its PEs {sink_pe(dep)} are gone" in lost[1]


def test_deploy_with_rm_on_the_command_line(tmp_path):
    import subprocess
    import sys

    app = tmp_path / "app.py"
    app.write_text("from pescheduler import Application\napp = Application('cli-rm')\n"
                   "app.source('iterable', items=[{'x': i, 'ts': i} for i in range(100)], rate=50)"
                   ".sink('jsonl', path='out.jsonl')\n")
    result = subprocess.run([sys.executable, "-m", "pescheduler", "deploy", str(app), "--rm", "local",
                             "--workers", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "cli-rm finished" in result.stdout
    assert "resource manager 'local' ready" in result.stdout
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 100


def test_the_local_manager_counts_the_workers_already_running_here_before_lending(tmp_path):
    """The embedded cluster's workers use cores of this machine: the local manager lends only the
    cores they leave (it once read a cached scheduler view without them and lent 2 hosts on 2 cores)."""
    from pescheduler.worker.cgroup import core_budget

    cores, _ = core_budget()
    with pescheduler.deploy(numbers_app(tmp_path / "o.jsonl", 2_000, 1_000), workers=2, rm="local",
                            plugins=["support_ops"], policies=[]) as dep:
        until(lambda: dep.status()["resources"].get("budget", {}).get("workers_here") == 2, WAIT,
              "the local manager to count the two embedded workers")
        assert dep.resources().lendable == min(2, max(0, cores - 2))
        dep.stop()
