"""The window on Arrow batches: vectorised panes, the same state and results as rows."""

import pyarrow as pa

from pescheduler.state.groups import unpack_namespaced
from pescheduler.operator import MAX_WATERMARK, Emitter
from pescheduler.operators.window import Window

EVENTS = [{"car": f"c{i % 7}", "speed": float(i % 13), "ts": 1_000 * i} for i in range(200)]


def window():
    return Window(size="30s", aggregates={"avg": ("avg", "speed"), "n": ("count", "car")}, key="car")


def fire(w, batches):
    out = Emitter()
    for b in batches:
        w.process(b, out)
    w.on_watermark(MAX_WATERMARK, out)
    return [r for x in (out.batches or []) for r in x.to_pylist()] + list(out)


def test_columnar_state_snapshots_as_rows_and_restores_into_a_row_window():
    w = window()
    w.process(pa.RecordBatch.from_pylist(EVENTS[:120]), Emitter())
    state = w.snapshot()
    rows = window()
    rows.process(EVENTS[:120], Emitter())
    as_dicts = lambda snap: {**snap, "groups": unpack_namespaced(snap["groups"])}   # bytes differ in memo refs
    assert as_dicts(state) == as_dicts(rows.snapshot())
    restored = window()
    restored.restore(state)
    assert fire(restored, [EVENTS[120:]]) == fire(rows, [EVENTS[120:]])


def test_rows_after_arrow_batches_continue_the_same_windows():
    mixed = fire(window(), [pa.RecordBatch.from_pylist(EVENTS[:90]), EVENTS[90:150],
                            pa.RecordBatch.from_pylist(EVENTS[150:])])
    assert mixed == fire(window(), [EVENTS])


def test_late_rows_of_an_arrow_batch_go_to_the_late_output():
    w = window()
    w.process(pa.RecordBatch.from_pylist(EVENTS[100:]), Emitter())
    w.on_watermark(150_000, Emitter())
    out = Emitter()
    w.process(pa.RecordBatch.from_pylist(EVENTS[:3] + EVENTS[199:]), out)
    assert out.sides == {"late": EVENTS[:3]}


def test_nulls_fall_back_to_rows_and_are_dead_lettered_alone():
    batch = pa.RecordBatch.from_pylist(EVENTS[:5] + [{"car": "c1", "speed": None, "ts": 5_000}])
    out = Emitter()
    w = window()
    w.process(batch, out)
    assert [d.item["speed"] for d in out.dead] == [None]
    assert sum(r["n"] for r in fire(w, [])) == 5
