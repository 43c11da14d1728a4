"""The benches' exactly-once sink (bench/benchops.py ``arrivals``) checks the order the docs promise.

A moved key group's tuples wait for its state while other groups go on (docs/state.md), so after a
keyed operator the promise is per-key order; across keys the order may change. CI's hosts bench on
Spark failed on that (70 batches "out of order", none of them within a key).
"""

import importlib.util
import json
import os

# Loaded by path: bench/ on sys.path would let its kafka.py shadow the Kafka client for every later test.
_SPEC = importlib.util.spec_from_file_location(
    "benchops", os.path.join(os.path.dirname(__file__), "..", "..", "bench", "benchops.py"))
benchops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(benchops)

KEYS = 4


def rows(numbers):
    return [{"n": n, "key": n % KEYS, "sum": 0} for n in numbers]


def seen(tmp_path, batches, keys=KEYS):
    sink = benchops.Arrivals(str(tmp_path / "a.json"), keys=keys)
    for batch in batches:
        sink.process(rows(batch), None)
    sink.flush(None)
    with open(tmp_path / "a.json") as f:
        return json.load(f)


def test_key_groups_released_after_others_are_in_order_per_key(tmp_path):
    # 0..7 in order; then 8..15 arrive key by key, key 2's after key 3's (its group waited)
    result = seen(tmp_path, [range(0, 8), [8, 12], [9, 13], [11, 15], [10, 14]])
    assert (result["out_of_order"], result["duplicates"], result["runs"]) == (0, 0, [[0, 16]])
    assert result["reordered"] == 4


def test_a_keys_number_after_its_next_one_is_out_of_order(tmp_path):
    result = seen(tmp_path, [range(0, 9), [13], [9]])      # 9 and 13 are key 1's: 13 came first
    assert result["out_of_order"] == 1
    assert result["runs"] == [[0, 10], [13, 14]]


def test_without_keys_a_reordered_batch_is_out_of_order(tmp_path):
    result = seen(tmp_path, [range(0, 4), [6, 7], [4, 5]], keys=None)
    assert (result["out_of_order"], result["reordered"]) == (2, 2)
