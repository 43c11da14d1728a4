"""The fused executor: routing, watermarks, end of stream, error isolation, side outputs."""

from __future__ import annotations

import pytest
from support_ops import Collect, Numbers, RunningSum, Tag

from pescheduler import MAX_WATERMARK, MIN_WATERMARK, Operator, OperatorContext, Parallelism
from pescheduler.errors import DeliveryFailed
from pescheduler.worker.chain import CallbackError, Chain
from pescheduler.testing import CollectingOutput, RunResult


class Boom(Operator):
    """Stateless: raises on odd ``n``."""

    name = "boom"

    def process(self, batch, emit):
        emit.many([t if t["n"] % 2 == 0 else 1 / 0 for t in batch])


class StatefulBoom(Boom):
    name = "stateful_boom"
    parallelism = Parallelism.KEYED


class Marks(Operator):
    """Records the watermarks it sees; emits on late side output for n == 3."""

    name = "marks"
    outputs = ("late",)

    def __init__(self):
        self.seen = []

    def process(self, batch, emit):
        for t in batch:
            (emit.to("late", t) if t["n"] == 3 else emit(t))

    def on_watermark(self, wm, emit):
        self.seen.append(wm)


class FailingFlush(Operator):
    name = "failing_flush"

    def process(self, batch, emit):
        emit.many(batch)

    def flush(self, emit):
        raise OSError("disk full")


def linear(*ops):
    names = [f"op{i}" for i in range(len(ops))]
    edges = [(names[i], "out", names[i + 1]) for i in range(len(ops) - 1)]
    result = RunResult()
    chain = Chain(dict(zip(names, ops)), edges, {(names[-1], "out"): [CollectingOutput(result)]},
                  on_side=lambda op, port, items: result.sides.setdefault(port, []).extend(items))
    for name, op in zip(names, ops):
        op.open(OperatorContext(op_id=name, key_field="key"))
    return chain, names, result


def batch(lo, hi):
    return [{"n": i, "key": i % 2, "ts": i} for i in range(lo, hi)]


class Undeliverable(Operator):
    """A stateless sink whose external system took the batch's first half, then went away."""

    name = "undeliverable"

    def __init__(self):
        self.delivered = []

    def process(self, batch, emit):
        self.delivered += batch[:len(batch) // 2]
        raise DeliveryFailed("broker gone")


def test_a_sink_that_cannot_deliver_fails_the_pe_instead_of_rerunning_the_batch():
    """Finding 4 of issue 31: re-run tuple by tuple, the half already delivered went out twice
    and the failure became dead letters nobody reads as lost output."""
    sink = Undeliverable()
    chain, names, result = linear(Numbers(), sink)
    with pytest.raises(DeliveryFailed, match="broker gone"):
        chain.emit_from("op0", batch(0, 6))
    assert [t["n"] for t in sink.delivered] == [0, 1, 2]
    assert chain.dead_letters == []


def test_stateless_error_dead_letters_only_the_bad_tuples():
    chain, names, result = linear(Numbers(), Boom(), Tag("ok"))
    chain.emit_from("op0", batch(0, 6))
    assert [t["n"] for t in result.output] == [0, 2, 4]
    assert [d.item["n"] for d in chain.dead_letters] == [1, 3, 5]
    assert "ZeroDivisionError" in chain.dead_letters[0].error and chain.dead_letters[0].operator == "op1"
    assert chain.nodes["op1"].stats.dead_letters == 3


def test_stateful_error_dead_letters_the_whole_batch():
    chain, names, result = linear(Numbers(), StatefulBoom())
    chain.emit_from("op0", batch(0, 4))
    assert result.output == []
    assert [d.item["n"] for d in chain.dead_letters] == [0, 1, 2, 3]


def test_watermarks_and_end_reach_every_operator_in_order():
    marks = Marks()
    chain, names, result = linear(Numbers(), marks, Tag())
    chain.emit_from("op0", batch(0, 5))
    chain.watermark_from("op0", 10)
    chain.watermark_from("op0", 5)          # not an advance: ignored
    chain.end_from("op0")
    assert marks.seen == [10, MAX_WATERMARK]
    assert result.watermarks == [10, MAX_WATERMARK] and result.ended
    assert chain.finished
    assert [t["n"] for t in result.sides["late"]] == [3]
    assert chain.nodes["op1"].stats.side == {"late": 1}


def test_operator_with_two_inputs_takes_the_minimum_watermark():
    marks = Marks()
    result = RunResult()
    chain = Chain({"a": Numbers(), "b": Numbers(), "m": marks}, [("a", "out", "m"), ("b", "out", "m")],
                  {("m", "out"): [CollectingOutput(result)]})
    chain.watermark_from("a", 100)
    assert marks.seen == []                 # b has not reported yet
    chain.watermark_from("b", 40)
    chain.watermark_from("a", 200)
    assert marks.seen == [40]
    chain.end_from("a")
    assert not chain.nodes["m"].ended       # b still open
    chain.end_from("b")
    assert marks.seen == [40, MAX_WATERMARK] and result.ended


def test_failing_flush_fails_loudly():
    chain, names, result = linear(Numbers(), FailingFlush())
    with pytest.raises(CallbackError, match="op1.flush raised OSError: disk full"):
        chain.end_from("op0")


def test_fan_out_delivers_the_same_batch_to_each_consumer():
    sink_a, sink_b = Collect(), Collect()
    chain = Chain({"s": Numbers(), "a": sink_a, "b": sink_b}, [("s", "out", "a"), ("s", "out", "b")])
    chain.emit_from("s", batch(0, 3))
    assert sink_a.items == sink_b.items == batch(0, 3)


def test_stats_count_tuples_and_busy_time():
    chain, names, result = linear(Numbers(), RunningSum())
    chain.emit_from("op0", batch(0, 100))
    stats = chain.nodes["op1"].stats
    assert (stats.tuples_in, stats.tuples_out, stats.batches_in) == (100, 100, 1)
    assert stats.busy_s > 0


def test_an_operator_ends_when_its_last_open_input_is_a_released_copy():
    # The source ended first; the copy's partials edge was the only open input left. When the
    # copy is released (its edge goes), the window must end and fire: it waited forever before
    # (found by bench/overload.py: a drain that never finished).
    from support_ops import WindowCount

    sink = Collect()
    win = WindowCount(size=10)
    chain = Chain({"s": Numbers(count=25, step=1), "w": win, "k": sink},
                  [("s", "out", "w"), ("w#1", "out", "w"), ("w", "out", "k")], copies={"w#1": "w"})
    chain.emit_from("s", [{"n": i, "ts": i} for i in range(25)])
    chain.end_from("s")
    assert not chain.nodes["w"].ended and sink.items == []
    chain.set_edges([("s", "out", "w"), ("w", "out", "k")], initial_wm=MIN_WATERMARK)
    assert chain.nodes["w"].ended
    assert [(r["window_start"], r["count"]) for r in sink.items] == [(0, 10), (10, 10), (20, 5)]
    assert chain.nodes["k"].ended


class GcProbe(Operator):
    """Records whether the cyclic GC was running while it processed each batch."""

    name = "gc_probe"

    def __init__(self):
        self.enabled = []

    def process(self, batch, emit):
        import gc

        self.enabled.append(gc.isenabled())
        emit.many(batch)


def test_the_gc_is_paused_for_a_batch_and_left_as_the_caller_had_it():
    import gc

    from pescheduler.testing import run_operators

    probe = GcProbe()
    assert gc.isenabled()
    result = run_operators([{"n": i} for i in range(5)], probe, batch_size=2, ts_field=None)
    assert probe.enabled == [False, False, False] and gc.isenabled()
    assert [t["n"] for t in result.output] == [0, 1, 2, 3, 4]
    gc.disable()
    try:
        run_operators([{"n": 1}], GcProbe(), ts_field=None)
        assert not gc.isenabled()             # a caller that paused it keeps it paused
    finally:
        gc.enable()


class Timeless(CollectingOutput):
    """An output whose results carry their own times (the in-process ep engine's deliveries)."""

    timeless = True


def test_a_timeless_output_gets_batches_and_the_end_but_no_watermark_call():
    marks, kept, timeless = Marks(), RunResult(), RunResult()
    chain = Chain({"s": Numbers(), "m": marks}, [("s", "out", "m")],
                  {("m", "out"): [CollectingOutput(kept), Timeless(timeless)]})
    chain.emit_from("s", batch(0, 3))
    chain.watermark_from("s", 7)
    chain.end_from("s")
    assert marks.seen == [7, MAX_WATERMARK]
    assert kept.watermarks == [7] and timeless.watermarks == []     # the end goes by end()
    assert [t["n"] for t in timeless.output] == [0, 1, 2] and timeless.ended and kept.ended


def test_an_output_added_by_rewire_gets_the_next_batches_and_watermarks():
    # each node keeps its out port's routes (Chain._build_routes): a rewire must renew them
    marks, first, added = Marks(), RunResult(), RunResult()
    chain = Chain({"s": Numbers(), "m": marks}, [("s", "out", "m")], {("m", "out"): [CollectingOutput(first)]})
    chain.emit_from("s", batch(0, 2))
    out = CollectingOutput(added)
    chain.rewire(added=[("m", "out", out)])
    chain.emit_from("s", batch(4, 6))                  # (Marks sends n == 3 to its late port)
    chain.watermark_from("s", 9)
    assert [t["n"] for t in first.output] == [0, 1, 4, 5] and [t["n"] for t in added.output] == [4, 5]
    assert added.watermarks == [9]
    chain.rewire(removed=[out])
    chain.emit_from("s", batch(6, 7))
    assert [t["n"] for t in added.output] == [4, 5] and [t["n"] for t in first.output][-1] == 6


def test_an_emitters_side_outputs_and_dead_letters_are_its_own():
    # Emitter keeps them as class-level None until first used (no __init__ per batch)
    from pescheduler import Emitter

    one = Emitter()
    one.to("late", 1)
    one.dead_letter(2, ValueError("bad"))
    other = Emitter()
    assert one.sides == {"late": [1]} and [d.item for d in one.dead] == [2]
    assert other.sides is None and other.dead is None and other.batches is None and other == []
