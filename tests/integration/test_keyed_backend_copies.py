"""An over window, a keyed pattern, a session window and an interval join copied and released on a real Dask
deployment while tuples flow, with their keys' state in either keyed state backend (on ``disk``: a
RocksDB store per instance, on its worker), and each of them whose worker is
SIGKILLed and restored from a checkpoint (on disk): the output is the plain-Python reference's, each row once.

The source holds its last tuples until the test has applied the Replicate and the Release, so both
happen mid-stream however slow the machine; every key holds state at every moment (an over
window's events, a pattern's open runs, a join's buffered events), which moves with its key group.
"""

from __future__ import annotations

from collections import Counter

import pytest
from support_ops import committed_output, copy_holds
from test_join_copies import BOUNDS, interval_reference, two_inputs
from test_process_copies import killed_and_restored, replicated_and_released

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration

COUNT, KEYS, RATE, SIZE, WITHIN = 9_000, 16, 2_000, 200, 100
BACKENDS = pytest.mark.parametrize("backend", ["memory", "disk"])


def numbers(app: Application, hold: str | None = None):
    """``{"n": i, "key": i % KEYS, "ts": i}``, keyed; held near the end until the file ``hold`` exists."""
    held = {} if hold is None else copy_holds(hold, COUNT)
    return app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, **held).key_by("key")


def over(stream):
    return stream.window(size=SIZE, slide="event", aggregates={"c": "count", "s": ("sum", "n")}, id="op")


def over_rows(rows: list) -> Counter:
    return Counter((r["key"], r["window_end"], r["c"], r["s"]) for r in rows)


def over_reference() -> Counter:
    """One row per event over its key's events in (ts - SIZE, ts]."""
    want = Counter()
    for i in range(COUNT):
        mine = [n for n in range(max(0, i - SIZE + 1), i + 1) if n % KEYS == i % KEYS]
        want[i % KEYS, i + 1, len(mine), sum(mine)] += 1
    return want


def pattern(stream):
    """``x y+`` where x is an ``n`` divisible by 3: per key (n = k + 16j, so n % 3 cycles) every x
    starts a run that takes the next two events of its key and dies at the third."""
    return stream.pattern("x y+", define={"x": lambda e, m: e["n"] % 3 == 0, "y": lambda e, m: e["n"] % 3 != 0},
                          within=WITHIN, id="op")


def pattern_rows(rows: list) -> Counter:
    return Counter((r["start_ts"], r["ts"]) for r in rows)


def pattern_reference() -> Counter:
    want = Counter()
    for k in range(KEYS):
        mine = list(range(k, COUNT, KEYS))
        for i, start in enumerate(mine):
            if start % 3:
                continue
            for n in mine[i + 1:]:
                if n % 3 == 0 or n - start > WITHIN:
                    break
                want[start, n] += 1
    return want


def session(stream):
    """Sessions with a gap of two keys' spacing: each key's events (16 apart) form one session, open
    from the key's first event to the end of the stream, so every key's state moves and is restored."""
    return stream.window(gap=2 * KEYS, aggregates={"c": "count", "s": ("sum", "n")}, id="op")


def session_rows(rows: list) -> Counter:
    return Counter((r["key"], r["window_start"], r["window_end"], r["c"], r["s"]) for r in rows)


def session_reference() -> Counter:
    return Counter((k, k, max(range(k, COUNT, KEYS)) + 2 * KEYS, len(range(k, COUNT, KEYS)), sum(range(k, COUNT, KEYS)))
                   for k in range(KEYS))


def copied(cluster, monkeypatch, tmp_path, backend, build) -> list:
    """``build(app, hold)`` (its last operator ``op``) replicated and released mid-stream; its output."""
    out, release = tmp_path / "out.jsonl", tmp_path / "release"
    app = Application(f"keyed-copies-{backend}")
    build(app, str(release)).sink("jsonl", path=str(out))
    where = {"cluster": cluster} if backend == "memory" else {"workers": 2}
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))       # the forked workers' setting
    with pescheduler.deploy(app, plugins=["support_ops"], policies=[], state=backend, **where) as dep:
        status = replicated_and_released(dep, "op", release)
    assert status["state"] == "finished", status
    return committed_output(out)


@BACKENDS
def test_over_window_replicated_and_released_mid_stream_is_exact(cluster, monkeypatch, tmp_path, backend):
    rows = copied(cluster, monkeypatch, tmp_path, backend, lambda app, hold: over(numbers(app, hold)))
    assert over_rows(rows) == over_reference()


@BACKENDS
def test_pattern_replicated_and_released_mid_stream_is_exact(cluster, monkeypatch, tmp_path, backend):
    rows = copied(cluster, monkeypatch, tmp_path, backend, lambda app, hold: pattern(numbers(app, hold)))
    want = pattern_reference()
    assert sum(want.values()) > COUNT // 3
    assert pattern_rows(rows) == want


@BACKENDS
def test_session_window_replicated_and_released_mid_stream_is_exact(cluster, monkeypatch, tmp_path, backend):
    """Its key groups move with their open sessions (``export_groups``/``import_groups``), the
    timers of the groups that left dropped unread where they were."""
    rows = copied(cluster, monkeypatch, tmp_path, backend, lambda app, hold: session(numbers(app, hold)))
    assert session_rows(rows) == session_reference()


def test_interval_join_on_disk_replicated_and_released_mid_stream_is_exact(cluster, monkeypatch, tmp_path):
    """The interval join on ``memory``: test_join_copies."""
    lo, hi = BOUNDS

    def build(app, hold):
        left, right = two_inputs(app, hold)
        return left.join_interval(right, by="key", lower=lo, upper=hi, id="op")
    rows = copied(cluster, monkeypatch, tmp_path, "disk", build)
    assert sorted((r["left"]["n"], r["right"]["n"]) for r in rows) == interval_reference()


def interval_join(app: Application):
    lo, hi = BOUNDS
    left, right = two_inputs(app)
    return left.join_interval(right, by="key", lower=lo, upper=hi, id="op")


def join_rows(rows: list) -> list:
    return sorted((r["left"]["n"], r["right"]["n"]) for r in rows)


@pytest.mark.parametrize("what", ["over", "pattern", "join", "session"])
def test_a_sigkilled_worker_restored_from_a_checkpoint_on_disk_is_exact(monkeypatch, tmp_path, what):
    out = tmp_path / "out.jsonl"
    app = Application(f"keyed-recovery-{what}")
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path))
    build, rows_of, reference = {"over": (lambda app: over(numbers(app)), over_rows, over_reference),
                                 "pattern": (lambda app: pattern(numbers(app)), pattern_rows, pattern_reference),
                                 "join": (interval_join, join_rows, interval_reference),
                                 "session": (lambda app: session(numbers(app)), session_rows, session_reference)}[what]
    build(app).sink("jsonl", path=str(out))
    rows = killed_and_restored(app, "op", tmp_path, out, state="disk")
    assert rows_of(rows) == reference()
