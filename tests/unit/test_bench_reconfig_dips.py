"""bench/reconfig.py's dips on a stream that arrives in bursts: the loaded suite's quick run divided
by a steady rate of 0 (more than half of the 100 ms buckets away from the applies were empty, so
their median was 0) and the bench failed with a ZeroDivisionError instead of printing its rows."""

import importlib.util
import math
import os
import sys

# Loaded by path, and sys.path as it was after (the bench puts bench/ on it for its operators): bench/
# on sys.path would let its kafka.py shadow the Kafka client for every later test.
_SPEC = importlib.util.spec_from_file_location(
    "reconfig_bench", os.path.join(os.path.dirname(__file__), "..", "..", "bench", "reconfig.py"))
reconfig = importlib.util.module_from_spec(_SPEC)
_PATH = list(sys.path)
try:
    _SPEC.loader.exec_module(reconfig)
finally:
    sys.path[:] = _PATH


def run_of(times: list[float], sizes: list[int], applies: list[tuple[float, float]]) -> dict:
    return {"result": {"times": times, "sizes": sizes}, "t_stop": times[-1],
            "applies": [{"t0": t0, "t1": t1} for t0, t1 in applies]}


def test_a_steady_stream_is_read_at_its_median_bucket():
    run = run_of([i * 0.01 for i in range(2_000)], [10] * 2_000, [(5.0, 5.2)])
    steady, how, dip = reconfig.dips(run)
    assert math.isclose(steady, 1_000.0) and how.startswith("median") and math.isclose(dip[0], 0.9)


def test_a_stream_in_bursts_is_read_at_its_mean_bucket_and_its_dips_are_empty_buckets():
    run = run_of([i * 0.35 for i in range(60)], [1_000] * 60, [(5.0, 5.2), (12.0, 12.1)])
    steady, how, dip = reconfig.dips(run)
    assert 2_500 < steady < 3_200, steady              # 1,000 tuples every 0.35 s
    assert "over half of them empty" in how and dip == {0: 0.0, 1: 0.0}
