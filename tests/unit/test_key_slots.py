"""Key -> slot mapping of the columnar window: the same windows and state as the row window, whatever
dictionary (or none) each batch's key column brings, with unseen and null keys on the way."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pescheduler.operator import MAX_WATERMARK, Emitter
from pescheduler.operators.key_slots import KeySlots
from pescheduler.operators.window import Window

KINDS = {                                      # key column kind -> (Arrow value type, dictionary-encoded?)
    "int64": (pa.int64(), False), "int32": (pa.int32(), False), "string": (pa.string(), False),
    "int64 dictionary": (pa.int64(), True), "string dictionary": (pa.string(), True),
    "large_string": (pa.large_string(), False),
}


def window():
    return Window(size="30s", aggregates={"avg": ("avg", "speed"), "n": ("count", "car"),
                                          "top": ("max", "speed")}, key="car")


def key_column(keys: list, kind: str, order: list) -> pa.Array:
    """``keys`` as ``kind``; dictionary columns get their own dictionary, in the order ``order`` gives."""
    value_type, encoded = KINDS[kind]
    if not encoded:
        return pa.array(keys, type=value_type)
    distinct = sorted({k for k in keys if k is not None}, key=lambda k: order.index(k) if k in order else 0)
    codes = [None if k is None else distinct.index(k) for k in keys]
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(distinct, type=value_type))


def as_batch(rows: list, kind: str, order: list) -> pa.RecordBatch:
    keys = [r["car"] for r in rows]
    return pa.RecordBatch.from_arrays(
        [key_column(keys, kind, order), pa.array([r["speed"] for r in rows], pa.float64()),
         pa.array([r["ts"] for r in rows], pa.int64())], names=["car", "speed", "ts"])


def fire(w, batches):
    out = Emitter()
    for b in batches:
        w.process(b, out)
    w.on_watermark(MAX_WATERMARK, out)
    return [r for x in (out.batches or []) for r in x.to_pylist()] + list(out)


rows = st.fixed_dictionaries({"car": st.integers(0, 60), "speed": st.floats(-1e3, 1e3),
                              "ts": st.integers(0, 200_000)})


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), batches=st.lists(st.lists(rows, min_size=1, max_size=40),
       min_size=1, max_size=8), order=st.permutations(range(61)), null_at=st.integers(-1, 7))
def test_columnar_window_matches_the_row_window_over_batches_with_their_own_dictionaries(
        kind, batches, order, null_at):
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
    assert columnar.snapshot() == reference.snapshot()
    assert fire(columnar, []) == fire(reference, [])


def test_slots_stay_fixed_across_dictionaries_and_both_paths():
    slots = KeySlots()
    assert slots.slots(pa.array([7, 3, 9])).tolist() == [0, 1, 2]
    assert slots.slots(pa.array([9, 11, 7], pa.int32())).tolist() == [2, 3, 0]     # Arrow path, cast
    assert slots.slots(pa.array([3])).tolist() == [1]                             # dict path: 4 known
    assert slots.slots(pa.array([12, 11, 7, 13])).tolist() == [4, 3, 0, 5]
    assert slots.keys == [7, 3, 9, 11, 12, 13] and slots.array().to_pylist() == slots.keys
    assert {k: slots.index[k] for k in slots.keys} == {k: i for i, k in enumerate(slots.keys)}


def test_float_keys_keep_python_equality():
    slots = KeySlots()
    assert slots.slots(pa.array([0.0, -0.0, 1.5])).tolist() == [0, 0, 1]
