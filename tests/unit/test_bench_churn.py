"""bench/state.py's source (bench/benchops.py ``churn``) reads what came due once a poll interval.

Its driver reads again at once after a read that gave something, so a source that gave the changes
due at each read spun: at 10^7 keys a change or few a read, the source's worker at 90 % of a core
beside the state's, whose stall the table measures (docs/state-log.md, session 65).
"""

import importlib.util
import os

# Loaded by path: bench/ on sys.path would let its kafka.py shadow the Kafka client for every later test.
_SPEC = importlib.util.spec_from_file_location(
    "benchops", os.path.join(os.path.dirname(__file__), "..", "..", "bench", "benchops.py"))
benchops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(benchops)


def test_changes_come_once_a_poll_interval_and_the_end_at_the_next_read(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(benchops.time, "monotonic", lambda: now[0])
    until = tmp_path / "done"
    churn = benchops.Churn(keys=10, until=str(until), changes=1000, ticks=500)
    assert [r["id"] for r in churn.read(100)] == list(range(10))     # the fill, whole
    assert churn.read(100) == []                # the pace starts here: nothing due yet
    now[0] = 100.001                            # a change is due, but within the poll interval
    assert churn.read(100) == []
    now[0] = 100.0025                           # past it: what came due since, in one read
    got = churn.read(100)
    assert [r["id"] == -1 for r in got] == [False, False, True]      # two changes, then a tick
    assert all(0 <= r["id"] < 10 for r in got[:2])
    until.touch()
    assert churn.read(100) is None              # the end at the next read, within a poll interval or not
