"""Key -> slot mapping of the columnar window: slots fixed for a key whichever path maps it
(windows against the row window over batches with their own dictionaries: test_op_window_columnar.py)."""

import pyarrow as pa

from pescheduler.operators.key_slots import KeySlots


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


def test_a_null_among_a_dictionarys_values_is_the_none_key():
    slots = KeySlots()
    assert slots.slots(pa.array(["a", None, "b"])).tolist() == [0, 1, 2]
    assert slots.keys == ["a", None, "b"]
