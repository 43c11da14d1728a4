"""The simulator: a fluid model that yields real snapshots and applies real actions."""

from __future__ import annotations

import gc
import time
from types import MappingProxyType

import pytest

from pescheduler.actions import (BorrowHosts, Fuse, Move, Release, Replicate, ReturnHost, Split)
from pescheduler.metrics import HostMetrics, MetricsSnapshot, OperatorMetrics, PEMetrics, WorkerMetrics
from pescheduler.operator import Parallelism
from pescheduler.plan.placement import Placement
from pescheduler.sim import SimOperator, Simulation

# 5-operator chain, op2 costs 4x the others: at 4,000 t/s it needs 1.6 cores, the others 0.4.
COST = 1e-4
RATE = 4000.0


def bottleneck_chain(**kw) -> Simulation:
    return Simulation.chain(5, cost_s=COST, costs={2: 4 * COST}, source_rate=RATE, **kw)


def test_snapshot_is_the_monitors_frozen_types():
    sim = bottleneck_chain()
    snap = sim.step()
    assert isinstance(snap, MetricsSnapshot) and snap.interval_s == 1.0 and snap.time == 1.0
    for mapping, cls in [(snap.operators, OperatorMetrics), (snap.pes, PEMetrics),
                         (snap.workers, WorkerMetrics), (snap.hosts, HostMetrics)]:
        assert isinstance(mapping, MappingProxyType)
        assert all(isinstance(v, cls) for v in mapping.values())
    assert isinstance(sim.placement, Placement)
    assert sim.placement.plan.ops["op2"].parallelism is Parallelism.STATELESS
    # standard slots (the runtime's layout) on each host's first worker; PEs on the others first
    assert {s.worker for s in sim.placement.slots.values()} == {"sim://h0/w0", "sim://h1/w0"}
    assert snap.pes["op0"].worker == "sim://h0/w1" and snap.pes["op0"].host == "h0"
    assert snap.pes["op3"].worker == "sim://h1/w1" and snap.pes["op4"].worker == "sim://h1/w2"


def test_bottleneck_busy_upstream_backpressured_downstream_idle():
    snap = bottleneck_chain().step()
    hot = snap.pes["op2"]
    assert hot.busy == pytest.approx(1.0)
    assert hot.queue_batches == hot.max_queue_batches == 8
    assert snap.pes["op1"].backpressure > 0.5
    assert snap.pes["op1"].busy + snap.pes["op1"].backpressure == pytest.approx(1.0)
    # the paced source, throttled (to 2500 of 4000 t/s), falls behind: it catches up as the
    # runtime's do, always has input ready and is blocked whenever it is not busy, never idle
    src = snap.pes["op0"]
    assert src.backpressure == pytest.approx(1 - src.busy) and src.idle == 0.0 and src.queue_batches == 0
    for down in ("op3", "op4"):
        assert snap.pes[down].backpressure == 0.0
        assert snap.pes[down].idle == pytest.approx(0.75)
    # the source is slowed to what op2 can take: 1 core / 4e-4 s
    assert snap.operators["op0"].tuples_out_per_s == pytest.approx(2500.0)
    assert snap.operators["op4"].tuples_in_per_s == pytest.approx(2500.0)
    assert snap.workers["sim://h0/w3"].cpu == pytest.approx(1.0)
    assert snap.hosts["h0"].cpu == pytest.approx((0.25 + 0.25 + 1.0) / 4)    # h0/w0 holds the slot


def test_replicating_by_the_right_factor_removes_backpressure():
    sim = bottleneck_chain()
    snap = sim.step()
    op = snap.operators["op2"]
    true_rate = op.tuples_in_per_s / op.busy                       # DS2: per-instance rate
    needed = -(-RATE // true_rate)                                 # ceil(4000 / 2500) = 2
    assert sim.apply(Replicate("op2", int(needed) - 1, reason="ds2"))
    assert sim.copies("op2") == 1
    snap = sim.step()
    assert snap.operators["op0"].tuples_out_per_s == pytest.approx(RATE)
    assert all(p.backpressure == 0.0 for p in snap.pes.values())
    copy = [p for p in sim.placement.pes.values() if p.copy_of == "op2"]
    assert len(copy) == 1 and snap.pes["op2#1"].busy == pytest.approx(0.8)
    # the copies convention: operator op2#1 of the physical plan, run by PE op2#1 on a slot
    assert sim.placement.copies_of("op2") == ["op2#1"] and copy[0].operators == ("op2#1",)
    assert ("op1", "out", "op2#1") in sim.placement.plan.edges and ("op2#1", "out", "op3") in sim.placement.plan.edges
    assert sorted(s.copies for s in sim.placement.slots.values()) == [(), ("op2#1",)]
    assert snap.operators["op2"].busy == snap.operators["op2#1"].busy == pytest.approx(0.8)   # per instance
    assert sim.apply(Release("op2", 1))
    assert sim.step().operators["op0"].tuples_out_per_s == pytest.approx(2500.0)
    assert "op2#1" not in sim.placement.plan.ops and all(not s.copies for s in sim.placement.slots.values())


def test_keyed_copies_are_bounded_by_key_skew():
    graph = {"src": SimOperator(1e-5), "agg": SimOperator(4e-4, 1.0, Parallelism.KEYED, key_skew=0.6),
             "sink": SimOperator(1e-5)}
    sim = Simulation(graph, [("src", "agg"), ("agg", "sink")], source_rate=5000.0, hosts=2, slots_per_host=2)
    assert sim.step().operators["src"].tuples_out_per_s == pytest.approx(2500.0)
    assert sim.apply(Replicate("agg", 3))
    snap = sim.step()
    copy_workers = {sim.placement.pes[f"agg#{k}"].worker for k in (1, 2, 3)}
    assert len(copy_workers) == 3 and copy_workers <= {s.worker for s in sim.placement.slots.values()}
    # the hot key group (60%) stays on one instance: 1 / (0.6 * 4e-4) t/s at most
    assert snap.operators["src"].tuples_out_per_s == pytest.approx(1 / (0.6 * 4e-4))
    assert snap.pes["src"].backpressure > 0


def test_fuse_split_move_change_the_pes():
    sim = bottleneck_chain()
    assert sim.apply(Fuse("op3", "op4"))
    snap = sim.step()
    assert "op3->op4" in snap.pes and "op3" not in snap.pes
    assert snap.pes["op3->op4"].operators == ("op3", "op4")
    assert snap.pes["op3->op4"].busy == pytest.approx(0.5)
    assert snap.operators["op4"].pe == "op3->op4"
    assert sim.apply(Split("op3->op4", ("op4",), worker="sim://h1/w3"))
    snap = sim.step()
    assert snap.pes["op4"].worker == "sim://h1/w3" and snap.pes["op4"].host == "h1"
    assert sim.apply(Move("op4", "sim://h1/w2"))
    snap = sim.step()
    assert snap.pes["op4"].worker == "sim://h1/w2"
    # two PEs on one worker share its core: moving op1 onto op2's worker makes it worse
    assert sim.apply(Move("op1", "sim://h0/w3"))
    snap = sim.step()
    assert snap.operators["op0"].tuples_out_per_s == pytest.approx(2000.0)   # 1 / (1e-4 + 4e-4)
    assert snap.workers["sim://h0/w2"].cpu == 0.0


def test_refusals_carry_reasons():
    sim = Simulation({"a": SimOperator(1e-5, parallelism=Parallelism.SINGLETON), "b": SimOperator(1e-5)},
                     [("a", "b")], hosts=2, cores_per_host=2, host_pool=1)
    cases = [Fuse("a", "a"), Fuse("a", "zzz"), Split("a", ("a",)), Move("a", "sim://h9/w0"),
             Move("a", "sim://h0/w1"), Replicate("a"), Replicate("nope"), Release("b"),
             ReturnHost("h0"), ReturnHost("h7")]
    assert [sim.apply(a) for a in cases] == [False] * len(cases)
    reasons = [e.reason for e in sim.log]
    assert all(reasons) and len(sim.refusals) == len(cases)
    assert "itself" in reasons[0] and "SINGLETON" in reasons[5] and "runs" in reasons[8]
    assert sim.log[0].interval == 0 and sim.log[0].applied is False
    before = sim.placement
    assert sim.step() and sim.placement is before                  # refusals change nothing


def test_borrow_and_return_hosts():
    sim = Simulation.chain(2, hosts=1, cores_per_host=2, host_pool=1)
    assert sim.apply(BorrowHosts(2))                               # granted 1 of 2
    assert sim.hosts == ["h0", "h1"] and "sim://h1/w1" in sim.placement.workers
    assert not sim.apply(BorrowHosts(1))
    assert "h1" in sim.step().hosts
    assert sim.apply(Move("op1", "sim://h1/w0"))
    assert not sim.apply(ReturnHost("h1"))
    assert sim.apply(Move("op1", "sim://h0/w1"))
    assert sim.apply(ReturnHost("h1"))
    snap = sim.step()
    assert set(snap.hosts) == {"h0"} and set(snap.workers) == {"sim://h0/w0", "sim://h0/w1"}


def test_load_steps_change_rates_within_one_step():
    sim = bottleneck_chain()
    sim.set_source_rate(1000.0)
    low = sim.step()
    assert low.operators["op4"].tuples_in_per_s == pytest.approx(1000.0)
    assert low.pes["op2"].busy == pytest.approx(0.4) and low.pes["op0"].backpressure == 0.0
    sim.set_source_rate(10_000.0)
    high = sim.step()
    assert high.operators["op4"].tuples_in_per_s == pytest.approx(2500.0)
    assert high.pes["op0"].backpressure == pytest.approx(0.75)
    sim.set_source_rate({"op0": 1000.0})
    assert sim.step().operators["op4"].tuples_in_per_s == pytest.approx(1000.0)


def test_steady_load_is_steady_and_deterministic():
    a, b = bottleneck_chain(), bottleneck_chain()
    first = a.step()
    for _ in range(50):
        snap = a.step()
    assert snap.pes == first.pes or all(
        snap.pes[k].busy == first.pes[k].busy and snap.pes[k].backpressure == first.pes[k].backpressure
        for k in first.pes)
    assert snap.operators["op0"].tuples_out == 51 * 2500
    assert [b.step() for _ in range(51)][-1].operators == snap.operators


def test_selectivity_and_fan_in():
    graph = {"s1": SimOperator(1e-5, 0.5), "s2": SimOperator(1e-5), "join": SimOperator(1e-5, 2.0),
             "sink": SimOperator(1e-5)}
    sim = Simulation(graph, [("s1", "join"), ("s2", "join"), ("join", "sink")],
                     source_rate={"s1": 1000.0, "s2": 300.0})
    snap = sim.step()
    assert snap.operators["join"].tuples_in_per_s == pytest.approx(800.0)
    assert snap.operators["sink"].tuples_in_per_s == pytest.approx(1600.0)


def test_random_graph_is_seeded():
    a, b = Simulation.random(300, 30, seed=7), Simulation.random(300, 30, seed=7)
    assert a.placement == b.placement and a.step().pes == b.step().pes
    assert Simulation.random(300, 30, seed=8).placement != a.placement


def test_10000_operators_on_1000_hosts_builds_fast():
    sim = Simulation.random(10_000, 1_000, seed=1, source_rate=40_000.0)   # with hot spots
    gc.collect()                 # the garbage of the tests before this one is not this step's work:
    gc.disable()                 # after the whole suite (1.1 GB heap) a collection inside step() made it 1.4 s
    try:
        t = time.process_time()  # CPU time: a busy machine slows the wall clock, not the work
        snap = sim.step()
        elapsed = time.process_time() - t
    finally:
        gc.enable()
    assert len(snap.operators) == len(snap.pes) == 10_000
    assert len(snap.hosts) == 1_000 and len(snap.workers) == 4_000
    assert any(p.backpressure > 0 for p in snap.pes.values())
    assert max(w.cpu for w in snap.workers.values()) <= 1.0
    print(f"step() at 10,000 operators / 1,000 hosts: {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0


def test_copies_survive_fusing_their_original():
    sim = bottleneck_chain()
    assert sim.apply(Replicate("op2"))
    assert sim.apply(Fuse("op2", "op3"))
    snap = sim.step()
    assert snap.operators["op2"].pe == "op2->op3" and sim.copies("op2") == 1
    # half of op2 plus all of op3 on one core: 1 / (0.5 * 4e-4 + 1e-4) t/s
    assert snap.operators["op0"].tuples_out_per_s == pytest.approx(1 / 3e-4)
    assert snap.pes["op2->op3"].busy == pytest.approx(1.0)
    assert not sim.apply(Fuse("op2#1", "op4")) and "copies" in sim.log[-1].reason
