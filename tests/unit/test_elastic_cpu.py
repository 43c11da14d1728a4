"""Elasticity that tells the truth (issue 15, items 1 and 2): busy excludes waiting for a CPU, a copy onto a host
with no more CPU is refused with that reason, and the ``local`` manager lends only the cores here."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from types import MappingProxyType

import psutil
import pytest

from pescheduler.actions import Replicate
from pescheduler.control.controller import Controller, onto_saturated, steer
from pescheduler.metrics import HostMetrics, MetricsSnapshot
from pescheduler.control.protocol import ApplyRecord
from pescheduler.operator import Operator
from pescheduler.plan import transforms
from pescheduler.resource_managers import local
from pescheduler.sim import Simulation
from pescheduler.worker import cgroup
from pescheduler.worker.chain import Chain

PL = Simulation.chain(5).placement          # hosts h0, h1; a copy of op2 lands on h0 (slot-1)


# -- the core budget -----------------------------------------------------------------------------

def test_the_core_budget_honours_a_cgroup_quota_and_never_falls_below_one_core(tmp_path):
    mask = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")                    # no quota: the affinity mask decides
    assert cgroup.core_budget(str(cpu_max)) == (mask, f"{mask} CPUs in the affinity mask")
    cpu_max.write_text("50000 100000\n")                  # half a core: one whole core, not zero
    assert cgroup.core_budget(str(cpu_max)) == (1, f"cgroup quota 50000/100000 in {cpu_max}")
    cpu_max.write_text(f"{(mask + 3) * 100000} 100000\n")   # a quota above the mask: the mask decides
    assert cgroup.core_budget(str(cpu_max))[0] == mask
    assert cgroup.core_budget(str(tmp_path / "absent"))[0] == mask    # cgroup v1, or no cgroup fs


def test_local_lends_only_the_cores_left_by_the_workers_here_unless_oversubscribing(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("400000 100000\n")                 # a 4-core quota
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(local, "core_budget", lambda real=cgroup.core_budget: real(str(cpu_max)))
    rm = local.LocalResourceManager("tcp://unused:1", {"hosts": 3})
    rm.workers_here = 2                                   # the embedded cluster's two workers
    assert rm.lendable() == 2                             # 4 cores - 2 workers: two 1-worker hosts, not 3
    budget = rm.host_budget()
    assert budget["cores"] == 4 and budget["cores_from"] == f"cgroup quota 400000/100000 in {cpu_max}"
    assert budget["lendable"] == 2 and budget["oversubscribe"] is False
    rm.held["local-1"] = local._Held(local.Host("local-1"))
    assert rm.lendable() == 1 and rm.host_budget()["workers_lent"] == 1
    rm.workers_here = 3
    assert rm.lendable() == 0                             # the machine is full: nothing to lend
    two = local.LocalResourceManager("tcp://unused:1", {"hosts": 3, "workers-per-host": 2})
    two.workers_here = 1
    assert two.lendable() == 1                            # 3 spare cores hold one 2-worker host
    demo = local.LocalResourceManager("tcp://unused:1", {"hosts": 3, "oversubscribe": True})
    demo.workers_here = 4
    assert demo.lendable() == 3 and demo.host_budget()["oversubscribe"] is True


# -- busy excludes the wait for a CPU ----------------------------------------------------------------------------

class Spin(Operator):
    """Burns CPU for ``seconds`` of its own thread's CPU time per batch."""

    name = "spin"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def process(self, batch, emit) -> None:
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass


def test_busy_on_a_shared_core_is_the_cpu_the_pe_got_not_the_wall_time_it_waited():
    """The PE's thread and a spinning process pinned to one core: busy is the PE's CPU share."""
    core = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {core})
        result: dict = {}

        def pe_thread() -> None:
            os.sched_setaffinity(0, {core})               # this thread only (Linux: pid 0 = the caller)
            chain = Chain({"spin": Spin(0.02)}, [("src", "out", "spin")])
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            for _ in range(40):                           # 0.8 s of CPU; about twice that in wall time
                chain.emit_from("src", [{"x": 1}])
            result.update(busy=chain.nodes["spin"].stats.busy_s, wall=time.perf_counter() - wall0,
                          cpu=time.thread_time() - cpu0)
            tid = threading.get_native_id()
            result["proc_cpu"] = next(t.user_time + t.system_time for t in psutil.Process().threads() if t.id == tid)

        t = threading.Thread(target=pe_thread)
        t.start()
        t.join(60)
        assert not t.is_alive()
    finally:
        spinner.kill()
        spinner.wait(10)
    busy, wall = result["busy"], result["wall"]
    cpu = result["proc_cpu"]                              # the kernel's count for the PE's thread
    assert cpu == pytest.approx(0.8, abs=0.05)
    assert busy >= 0.78 and busy - cpu < 0.25 * (wall - cpu), (busy, cpu, wall)   # the CPU it got ...
    assert busy < 0.75 * wall, (busy, wall)                # ... not the wall time it waited for its share


# -- no copy onto a host with no more CPU ----------------------------------------------------------

def snapshot(h0_cpu: float, h1_cpu: float = 0.3) -> MetricsSnapshot:
    hosts = {"h0": HostMetrics("h0", h0_cpu), "h1": HostMetrics("h1", h1_cpu)}
    return MetricsSnapshot(1.0, 1.0, hosts=MappingProxyType(hosts))


def test_no_worker_is_cold_started_on_a_saturated_machine_with_nothing_to_borrow():
    """Replicate 3 of op2 finds 2 slots: an embedded cluster would start a worker for the third
    (Reconfigurer._cold_slot). On a machine with no more CPU and no lender that is refused, with
    the reason the decision log gets; with CPU to spare, or a host to borrow, it is not."""
    from pescheduler.control.controller import cold_start_refusal
    from pescheduler.resources import ResourceView

    held = ResourceView(held=("h0", "h1"))
    why = cold_start_refusal(Replicate("op2", 3), PL, snapshot(0.97, 0.95), 0.9, held)
    assert why.startswith("'op2' needs 3 standard slot(s)") and "a worker started on this machine would only " \
        "share its CPU: host 'h0' has no more CPU: the deployment uses 97% of its cores (above 90%)" in why, why
    assert cold_start_refusal(Replicate("op2", 3), PL, snapshot(0.97, 0.5), 0.9, held) == ""   # h1 has CPU
    assert cold_start_refusal(Replicate("op2", 3), PL, snapshot(0.97, 0.95), 0.9,
                              ResourceView(held=("h0", "h1"), lendable=1)) == ""              # borrow instead
    assert cold_start_refusal(Replicate("op2", 2), PL, snapshot(0.97, 0.95), 0.9, held) == ""  # warm slots
    # a borrowed host is not where a cold start lands: only h0 counts, and it is saturated
    assert cold_start_refusal(Replicate("op2", 3), PL, snapshot(0.97, 0.5), 0.9,
                              ResourceView(held=("h0", "h1"), borrowed=("h1",))) != ""
    _steered, refusal = steer(Replicate("op2", 3), PL, snapshot(0.97, 0.95), 0.9, held)
    assert refusal == why
    asked = []

    async def apply(action):
        asked.append(action)
        return ApplyRecord(action, True, action.reason)

    ctl = Controller({"rate": lambda s, p, r, c: [Replicate("op2", 3)]}, apply, saturated_cpu=0.9, cooldown_s=0,
                     resources=lambda: held)
    made = asyncio.run(ctl.tick(snapshot(0.97, 0.95), PL))
    assert not asked and [(d.outcome, d.detail) for d in made] == [("refused", why)]


def test_a_replicate_onto_a_saturated_host_is_steered_to_a_host_with_cpu_else_refused():
    assert onto_saturated(Replicate("op2"), PL, snapshot(0.5), 0.9) == ""
    why = onto_saturated(Replicate("op2"), PL, snapshot(0.97), 0.9)
    assert why == "host 'h0' has no more CPU: the deployment uses 97% of its cores (above 90%); a copy of 'op2' there would only share it"
    assert onto_saturated(Replicate("op2"), PL, snapshot(1.0), 1) == ""        # saturated-cpu: 1, never
    steered, refusal = steer(Replicate("op2", reason="hot"), PL, snapshot(0.97), 0.9)
    assert refusal == "" and repr(steered) == "Replicate('op2', 1, hosts=('h1',))"
    assert steered.reason == "hot; steered to h1: host 'h0' has no more CPU: the deployment uses 97% of its cores (above 90%)"
    assert transforms.replicate(PL, steered).pes["op2#1"].host == "h1"
    asked = []

    async def apply(action):
        asked.append(action)
        return ApplyRecord(action, True, action.reason)

    ctl = Controller({"rate": lambda s, p, r, c: [Replicate("op2", reason="op2 is 1.4 cores busy")]}, apply,
                     saturated_cpu=0.9, cooldown_s=0)
    both = snapshot(0.97, 0.95)                          # no host has CPU to spare: refused
    made = asyncio.run(ctl.tick(both, PL))
    assert [(d.outcome, d.detail) for d in made] == [("refused", why)] and asked == []
    assert [d.outcome for d in asyncio.run(ctl.tick(snapshot(0.97), PL))] == ["applied"]   # h1 has CPU
    assert [d.outcome for d in asyncio.run(ctl.tick(snapshot(0.4), PL))] == ["applied"]    # h0 has CPU again
    assert [repr(a) for a in asked] == ["Replicate('op2', 1, hosts=('h1',))", "Replicate('op2', 1)"]


class Sleep(Operator):
    """Blocks 50 ms per batch, as a call to a slow service would."""

    name = "sleep"

    def process(self, batch, emit) -> None:
        time.sleep(0.05)


def test_an_operator_that_blocks_is_busy_while_it_blocks():
    """Copies of a blocking operator help, so its blocked time counts (CPU time alone would not)."""
    chain = Chain({"sleep": Sleep()}, [("src", "out", "sleep")])
    for _ in range(4):
        chain.emit_from("src", [{"x": 1}])
    assert 0.19 < chain.nodes["sleep"].stats.busy_s < 1.0


# -- a host's CPU is the deployment's own ----------------------------------------------------------

def test_a_hosts_cpu_adds_up_the_deployments_processes_on_its_machine_and_a_lab_hosts_over_its_quota():
    """Hosts without a quota on one machine share its cores: the embedded host's figure counts
    its workers, the local manager's host's and the deploying process, over the machine's cores
    less the lab's quotas on it (the same silicon, which the lab's cgroups get first). A lab
    host's is its workers' CPU over their shares of its quota. Other users' load (``host_cpu``,
    what psutil sees) is only shown."""
    from pescheduler.control.monitor import host_figures

    def proc(worker, cpu, machine="m1", share=None, seen=0.99):
        return {"worker": worker, "cpu": cpu, "machine": machine, "machine_cores": 2, "share": share,
                "host_cpu": seen, "host_memory": 0.4}

    hosts = {"127.0.0.1": [proc("w0", 0.5), proc("w1", 0.25)],
             "local-1": [proc("w2", 0.25)],
             "lab-1": [proc("w3", 0.2, share=0.25), proc("w4", 0.1, share=0.25)],
             "far": [proc("w5", 0.5, machine="m2")]}
    figures = host_figures(hosts, "m1", 0.3)
    # m1: 0.5 + 0.25 + 0.25 + 0.3 (this process) = 1.3 of the 1.5 cores the lab's half core leaves
    assert figures["127.0.0.1"].cpu == pytest.approx(1.3 / 1.5) and figures["local-1"].cpu == pytest.approx(1.3 / 1.5)
    assert figures["lab-1"].cpu == pytest.approx(0.6)                  # 0.3 of its 0.5 core
    assert figures["far"].cpu == pytest.approx(0.25)                   # its own machine: this process is not there
    assert figures["127.0.0.1"].machine_cpu == 0.99 and figures["127.0.0.1"].workers == ("w0", "w1")
    assert figures["127.0.0.1"].memory == 0.4
    assert MetricsSnapshot(1.0, 1.0, hosts=MappingProxyType(figures)).saturated("127.0.0.1", 0.9) is None
    assert host_figures({"h": [proc("w0", 2.5)]}, "m1", 0.0)["h"].cpu == 1.0    # a fraction of its cores
