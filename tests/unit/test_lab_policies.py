"""The pure parts of the lab work (issue 15 items 3-4): copies go where CPU is spare, a hot PE moves off a
saturated host, and the lab refuses with what it lacks."""

from __future__ import annotations

import asyncio
from types import MappingProxyType

import dask.config

from pescheduler.actions import Hold
from pescheduler.control.controller import Controller
from pescheduler.metrics import HostMetrics, MetricsSnapshot, OperatorMetrics, PEMetrics
from pescheduler.control.protocol import ApplyRecord
from pescheduler.policies import copy, move
from pescheduler.resource_managers import lab_net
from pescheduler.sim import Simulation

PL = Simulation.chain(5).placement      # op0-op2 on h0 (w1-w3), op3-op4 on h1 (w1, w2); slot-1 on h0, slot-2 on h1


def snap(h0: float, h1: float, busy: dict[str, float]) -> MetricsSnapshot:
    pes = {p: PEMetrics(p, pe.operators, pe.worker, pe.host, busy=busy.get(p, 0.1), tuples_in_per_s=1000)
           for p, pe in PL.pes.items()}
    ops = {p: OperatorMetrics(p, p, tuples_in_per_s=1000, tuples_out_per_s=1000, busy=busy.get(p, 0.1))
           for p in PL.pes}
    hosts = {"h0": HostMetrics("h0", h0), "h1": HostMetrics("h1", h1)}
    return MetricsSnapshot(1.0, 1.0, MappingProxyType(ops), MappingProxyType(pes), hosts=MappingProxyType(hosts))


def test_move_takes_the_busiest_pe_off_a_saturated_host_to_the_idle_hosts_least_used_worker():
    actions = move.decide(snap(0.97, 0.2, {"op1": 0.9, "op2": 0.6}), PL, {})
    assert [repr(a) for a in actions] == ["Move('op1', 'sim://h1/w0')"]      # h1/w0 runs no PE
    assert actions[0].hold == Hold(rounds=2)
    assert actions[0].reason == ("host 'h0' has no more CPU: the deployment uses 97% of its cores (above 90%); its busiest "
                                 "PE op1 (90% busy) moves to h1 (20% of its cores in use)")


def test_move_does_nothing_without_a_saturated_host_a_hot_pe_or_an_idle_host():
    assert move.decide(snap(0.85, 0.2, {"op1": 0.9}), PL, {}) == []           # h0 has CPU left
    assert move.decide(snap(0.97, 0.2, {"op1": 0.3}), PL, {}) == []           # nothing hot there
    assert move.decide(snap(0.97, 0.7, {"op1": 0.9}), PL, {}) == []           # no host idle enough
    with dask.config.set({"pescheduler.policies.saturated-cpu": 1}):
        assert move.decide(snap(1.0, 0.2, {"op1": 0.9}), PL, {}) == []        # saturated-cpu 1: never


def test_the_controller_applies_a_move_only_after_the_host_stayed_saturated():
    applied = []

    async def apply(action):
        applied.append(action)
        return ApplyRecord(action, True)

    ctl = Controller({"move": lambda s, p, r, c: move.decide(s, p, c)}, apply, cooldown_s=0)
    hot = snap(0.97, 0.2, {"op1": 0.9})
    assert [d.outcome for d in asyncio.run(ctl.tick(hot, PL))] == []          # one window: held
    assert [d.outcome for d in asyncio.run(ctl.tick(hot, PL))] == ["applied"]
    assert [repr(a) for a in applied] == ["Move('op1', 'sim://h1/w0')"]


def test_copies_go_to_slots_on_hosts_with_cpu_to_spare():
    busy = {"op2": 0.95}
    (calm,) = copy.decide(snap(0.5, 0.5, busy), PL, {})
    assert repr(calm) == "Replicate('op2', 1)"                               # no host saturated: anywhere
    (steered,) = copy.decide(snap(0.97, 0.3, busy), PL, {})
    assert repr(steered) == "Replicate('op2', 1, hosts=('h1',))"             # h0's slot is no spare
    assert copy.decide(snap(0.97, 0.95, busy), PL, {}) == []                 # no spare slot anywhere


def test_without_root_the_lab_names_what_it_lacks(monkeypatch):
    monkeypatch.setattr(lab_net.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(lab_net.shutil, "which", lambda tool: None)
    monkeypatch.setattr(lab_net, "cpu_hierarchy", lambda mounts: None)
    assert lab_net.missing(netem=True) == [
        "root (running as uid 1000): namespaces and cgroups need it",
        "the `ip` command (Debian package iproute2) for network namespaces",
        "the `tc` command (Debian package iproute2) for delay and loss",
        "a cgroup CPU controller: neither cgroup v2 with `cpu` in cgroup.controllers nor the v1 `cpu` and "
        "`cpuacct` hierarchies are mounted"]


def test_rate_with_every_slot_host_saturated_borrows_or_asks_so_the_refusal_is_recorded():
    from pescheduler.resources import ResourceView
    from pescheduler.policies import rate

    sim = Simulation.chain(5, costs={2: 4e-4}, source_rate=4000.0)
    hot = sim.step()
    saturated = MetricsSnapshot(hot.time, hot.interval_s, hot.operators, hot.pes, hot.workers,
                                MappingProxyType({h: HostMetrics(h, 0.97) for h in ("h0", "h1")}))
    lendable = rate.pescheduler_policy_decide(saturated, sim.placement, ResourceView(lendable=2), {})
    assert [repr(a) for a in lendable] == ["BorrowHosts(2)"]                  # no spare slot: borrow
    asked = rate.pescheduler_policy_decide(saturated, sim.placement, ResourceView(lendable=0), {})
    assert [repr(a) for a in asked] == ["Replicate('op2', 2)"]               # nothing to borrow: on record
    refused = asyncio.run(Controller({"rate": lambda s, p, r, c: asked}, _never, cooldown_s=0)
                          .tick(saturated, sim.placement))
    assert [(d.outcome, d.detail[:34]) for d in refused] == [("refused", "host 'h0' has no more CPU: the dep")]


async def _never(action):
    raise AssertionError(f"{action!r} must not be applied")


def test_a_busy_instance_beside_one_with_room_is_no_concentration_for_a_stateless_operator():
    """Its routers send by credit: the original still draining its backlog (100 %) beside a copy with
    room (55 %) runs 0.78 of each on average, under ``hot``; a second copy would be one too many
    (issue 15). A MERGEABLE operator's routers split evenly: its hot instance still asks for one."""
    from pescheduler.actions import Replicate
    from pescheduler.operator import Parallelism
    from pescheduler.plan import transforms

    def two_instances(parallelism, copy_busy=0.55):
        pl = transforms.replicate(Simulation.chain(5, parallelism=parallelism).placement, Replicate("op2", 1))
        busy = {"op2": 1.0, "op2#1": copy_busy}
        ops = {o: OperatorMetrics(o, pl.original(o), tuples_in_per_s=1000, tuples_out_per_s=1000,
                                  busy=busy.get(o, 0.1)) for o in pl.plan.ops}
        pes = {p: PEMetrics(p, pe.operators, pe.worker, pe.host, busy=max(busy.get(o, 0.1) for o in pe.operators))
               for p, pe in pl.pes.items()}
        hosts = {"h0": HostMetrics("h0", 0.5), "h1": HostMetrics("h1", 0.5)}
        return copy.decide(MetricsSnapshot(1.0, 1.0, MappingProxyType(ops), MappingProxyType(pes),
                                           hosts=MappingProxyType(hosts)), pl, {})

    assert two_instances(Parallelism.STATELESS) == []
    (more,) = two_instances(Parallelism.MERGEABLE)
    assert isinstance(more, Replicate) and "an instance is 100% busy" in more.reason, more.reason
    (hot,) = two_instances(Parallelism.STATELESS, copy_busy=0.95)      # both hot: one more, once it stays so
    assert "its instances are 98% busy" in hot.reason and hot.hold == Hold(rounds=copy.SETTLE_ROUNDS), hot
