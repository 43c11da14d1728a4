"""The window on Arrow batches: vectorised panes, the same state and results as rows."""

import cloudpickle
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert _as_dicts(state) == _as_dicts(rows.snapshot())
    restored = window()
    restored.restore(state)
    assert fire(restored, [EVENTS[120:]]) == fire(rows, [EVENTS[120:]])


def test_a_columnar_snapshot_copies_its_arrays_and_leaves_the_rows_to_the_writer():
    """The snapshot in the PE's turn copies the panes' arrays and makes no row (rows and key
    groups made there stopped the stream 3.9-5.7 s at 10^6 keys): its groups are a view the
    checkpoint's writer reads, and they hold the panes as they were at the snapshot, however
    the stream folded into them since."""
    w = window()
    w.process(pa.RecordBatch.from_pylist(EVENTS[:120]), Emitter())
    state = w.snapshot()
    assert getattr(state["groups"], "view", None) is not None, "the panes were made rows in the PE's turn"
    assert state["groups"].view._packed is None
    w.process(pa.RecordBatch.from_pylist(EVENTS[120:]), Emitter())      # after the barrier
    rows = window()
    rows.process(EVENTS[:120], Emitter())
    assert _as_dicts(state) == _as_dicts(rows.snapshot())


def test_a_columnar_export_leaves_the_panes_arrays_and_makes_the_moving_rows_off_the_turn():
    """A rescale's export from a columnar window copies its arrays and clears the moving keys in
    numpy (made rows in the turn, a window of 10^6 keys paused 1.4 s): the window stays columnar,
    the part's rows are made when it is pickled and restore exactly the moving keys, as a row
    window's export does, and the window fires the others only; a moving key that came back
    would start from nothing."""
    from pescheduler.wire import key_group

    moving = frozenset(range(0, 128, 2))
    w, rows = window(), window()
    w.process(pa.RecordBatch.from_pylist(EVENTS[:120]), Emitter())
    rows.process(EVENTS[:120], Emitter())
    part = w.export_groups(moving)
    assert w._cols is not None, "the export made the Arrow panes rows in the PE's turn"
    taken = next(iter(part["groups"].values()))[1].taken
    assert taken._per_group is None
    expected = rows.export_groups(moving)
    blob = cloudpickle.dumps(part)
    assert unpack_namespaced(cloudpickle.loads(blob)["groups"]) == unpack_namespaced(expected["groups"])
    out = fire(w, [])
    assert out == fire(rows, [])
    assert {r["car"] for r in out} == {f"c{i}" for i in range(7) if key_group(f"c{i}") not in moving}
    back = window()
    back.process(pa.RecordBatch.from_pylist(EVENTS[:120]), Emitter())
    back.export_groups(moving)
    again = [r for r in EVENTS[120:150] if key_group(r["car"]) in moving]
    assert fire(back, [pa.RecordBatch.from_pylist(again)]) == fire(window(), [pa.RecordBatch.from_pylist(
        [r for r in EVENTS[:120] if key_group(r["car"]) not in moving] + again)])


def test_a_columnar_window_takes_its_key_groups_back_as_arrays():
    """A Replicate then a Release: the copy (a row window) gives the moved groups back and the
    columnar window puts their rows into its arrays (made rows, its remaining keys took 0.19-0.24
    s at 10^6 keys in the gaining turn); it stays columnar, and fires what one window would."""
    moving = frozenset(range(0, 128, 2))
    w, rows = window(), window()
    w.process(pa.RecordBatch.from_pylist(EVENTS[:120]), Emitter())
    rows.process(EVENTS[:120], Emitter())
    for one, batch in ((w, pa.RecordBatch.from_pylist(EVENTS[120:])), (rows, EVENTS[120:])):
        copy = window()
        copy.import_groups(cloudpickle.loads(cloudpickle.dumps(one.export_groups(moving))))
        one.import_groups(cloudpickle.loads(cloudpickle.dumps(copy.export_groups(moving))))
        one.process(batch, Emitter())
    assert w._cols is not None, "the import made the Arrow panes rows in the PE's turn"
    out = fire(w, [])
    assert out == fire(rows, [])                # the keys given back follow the others, as rows'
    assert sorted(out, key=lambda r: (r["window_start"], r["car"])) == \
        sorted(fire(window(), [EVENTS]), key=lambda r: (r["window_start"], r["car"]))


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


KINDS = {                                      # key column kind -> (Arrow value type, dictionary-encoded?)
    "int64": (pa.int64(), False), "int32": (pa.int32(), False), "string": (pa.string(), False),
    "int64 dictionary": (pa.int64(), True), "string dictionary": (pa.string(), True),
    "large_string": (pa.large_string(), False),
}


def key_column(keys: list, kind: str, order: list) -> pa.Array:
    """``keys`` as ``kind``; dictionary columns get their own dictionary, in the order ``order`` gives."""
    value_type, encoded = KINDS[kind]
    if not encoded:
        return pa.array(keys, type=value_type)
    distinct = sorted({k for k in keys if k is not None}, key=order.index)
    codes = [None if k is None else distinct.index(k) for k in keys]
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(distinct, type=value_type))


def as_batch(rows: list, kind: str, order: list) -> pa.RecordBatch:
    keys = [r["car"] for r in rows]
    return pa.RecordBatch.from_arrays(
        [key_column(keys, kind, order), pa.array([r["speed"] for r in rows], pa.float64()),
         pa.array([r["ts"] for r in rows], pa.int64())], names=["car", "speed", "ts"])


rows = st.fixed_dictionaries({"car": st.integers(0, 60), "speed": st.floats(-1e3, 1e3),
                              "ts": st.integers(0, 200_000)})


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), batches=st.lists(st.lists(rows, min_size=1, max_size=40),
       min_size=1, max_size=8), order=st.permutations(range(61)), null_at=st.integers(-1, 7),
       in_time_order=st.booleans())
def test_columnar_window_matches_the_row_window_over_batches_with_their_own_dictionaries(
        kind, batches, order, null_at, in_time_order):
    if in_time_order:                          # each batch's panes are then folded from slices
        batches = [sorted(b, key=lambda r: r["ts"]) for b in batches]
    text = "string" in kind
    batches = [[{**r, "car": f"k{r['car']}" if text else r["car"]} for r in b] for b in batches]
    order = [f"k{k}" if text else k for k in order]
    if 0 <= null_at < len(batches):            # a null key: that batch (and on) takes the row path
        batches[null_at][0]["car"] = None
    columnar, reference = window(), window()
    arrow = [as_batch(b, kind, order[i % 3:] + order[:i % 3]) for i, b in enumerate(batches)]
    for b, plain in zip(arrow, batches):
        columnar.process(b, Emitter())
        reference.process(plain, Emitter())
    assert _as_dicts(columnar.snapshot()) == _as_dicts(reference.snapshot())
    assert fire(columnar, []) == fire(reference, [])


def _as_dicts(snapshot: dict) -> dict:
    """A window snapshot with its key groups unpacked: packed bytes differ in pickle's memo references."""
    return {**snapshot, "groups": unpack_namespaced(snapshot["groups"])}
