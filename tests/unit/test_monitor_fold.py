"""The monitor folds only the placement's own PEs: while a reconfiguration replaces a PE, the old
one (same id, other operators or another worker) still answers for a moment."""

from __future__ import annotations

from pescheduler.control.monitor import Monitor
from pescheduler.sim import Simulation


def stats(operators: list[str], n: int) -> dict:
    return {"elapsed_s": 1.0, "state": "running", "backpressure_s": 0.0, "idle_s": 0.0, "queue_batches": 0,
            "queue_tuples": 0, "max_queue_batches": 8,
            "operators": {o: {"tuples_in": n, "tuples_out": n, "busy_s": 0.1, "dead_letters": 0, "side": {}}
                          for o in operators}}


def test_an_old_pe_answering_under_its_id_is_left_out_not_folded_in():
    placement = Simulation.chain(3).placement
    pe_id, pe = next((p, x) for p, x in placement.pes.items() if "op1" in x.operators)
    other = next(w for w in placement.workers if w != pe.worker)
    answers = [{"worker": pe.worker, "pes": {pe_id: stats(["key"], 50)}},       # same id, other operators
               {"worker": other, "pes": {pe_id: stats(list(pe.operators), 70)}}]  # same id, other worker
    snapshot = Monitor().update(answers, placement)
    assert pe_id not in snapshot.pes and "key" not in snapshot.operators
    right = [{"worker": pe.worker, "pes": {pe_id: stats(list(pe.operators), 90)}}]
    assert Monitor().update(right, placement).pes[pe_id].worker == pe.worker


def test_a_new_pe_under_the_same_id_starts_its_rates_from_zero_not_from_the_old_pes_counters():
    placement = Simulation.chain(3).placement
    pe_id, pe = next((p, x) for p, x in placement.pes.items() if "op1" in x.operators)

    def answer(elapsed: float, blocked: float, n: int) -> list[dict]:
        s = stats(list(pe.operators), n)
        s.update(elapsed_s=elapsed, backpressure_s=blocked)
        return [{"worker": pe.worker, "pes": {pe_id: s}}]

    monitor = Monitor()
    monitor.update(answer(60.0, 50.0, 600_000), placement)
    fresh = monitor.update(answer(0.5, 0.25, 1_000), placement).pes[pe_id]   # the PE was replaced
    assert 0.0 <= fresh.backpressure <= 1.0 and fresh.tuples_in_per_s >= 0.0
    assert all(monitor.latest.operators[o].busy >= 0.0 for o in pe.operators)


def test_rates_are_per_second_of_the_pes_own_clock_between_its_samples_not_the_monitors():
    """A loaded worker answers late by varying amounts: counters taken 1 s apart on the worker
    arrive 0.3 s or 1.8 s apart at the monitor. The rates (and a source's lag growth, sampled with
    its output) are per second of the PE's own elapsed time between the two samples."""
    placement = Simulation.chain(3).placement
    pe_id = placement.pe_of("op0")
    monitor = Monitor()

    def answer(elapsed: float, emitted: int, lag: int) -> list[dict]:
        s = stats(["op0"], emitted)
        s.update(elapsed_s=elapsed)
        s["operators"]["op0"]["lag"] = {"schedule": lag}
        return [{"worker": placement.pes[pe_id].worker, "pes": {pe_id: s}}]

    monitor.update(answer(10.0, 100_000, 500), placement)
    when, first = monitor._last[pe_id]
    monitor._last[pe_id] = (when - 1.8, first)          # the next answer reaches the monitor 1.8 s later
    late = monitor.update(answer(11.0, 110_000, 3_500), placement).operators["op0"]
    assert late.tuples_out_per_s == 10_000 and late.lag_per_s == 3_000           # 13,000/s offered
    assert late.tuples_out_per_s + late.lag_per_s == 13_000


def test_a_pe_s_state_is_the_last_checkpoint_s_figure_of_that_pe_with_its_operators_not_an_old_one_s():
    """The monitor gives each PE the state it referenced at the last complete checkpoint; a PE
    whose id that checkpoint knew with other operators (a Fuse or Split since) has none yet."""
    placement = Simulation.chain(3).placement
    pe_id, pe = next((p, x) for p, x in placement.pes.items() if "op1" in x.operators)
    answers = [{"worker": pe.worker, "pes": {pe_id: stats(list(pe.operators), 10)}}]
    monitor = Monitor()
    assert monitor.update(answers, placement).pes[pe_id].state_bytes is None      # no checkpoint yet
    monitor.checkpointed = lambda: {pe_id: {"operators": list(pe.operators), "bytes": 10, "state_bytes": 4_000}}
    assert monitor.update(answers, placement).pes[pe_id].state_bytes == 4_000
    monitor.checkpointed = lambda: {pe_id: {"operators": ["op1", "op9"], "bytes": 10, "state_bytes": 4_000}}
    assert monitor.update(answers, placement).pes[pe_id].state_bytes is None
