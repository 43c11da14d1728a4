"""Event time in real deployments: bad times from a jsonl file are dead letters with the reason and
every valid window comes out exact; times in seconds under another name drive windows in ms."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.integration

WAIT = 120
T0 = 1_700_000_000_000
BAD = [{"car": "c0", "speed": -1}, {"car": "c0", "speed": -2, "ts": None},
       {"car": "c0", "speed": -3, "ts": "noon"}, {"car": "c0", "speed": -4, "ts": float("nan")},
       {"car": "c0", "speed": -5, "ts": float("inf")}]


def write_jsonl(path, events) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)      # NaN, Infinity: legal for json.loads


def windows(path) -> Counter:
    with open(path) as f:
        return Counter({(r["car"], r["window_start"]): r["n"] for r in map(json.loads, f)})


def test_bad_event_times_from_jsonl_are_dead_letters_and_every_window_is_exact(cluster, tmp_path):
    good = [{"car": f"c{i % 3}", "speed": i, "ts": T0 + i * 100} for i in range(180)]
    events = good[:40] + BAD + good[40:]
    write_jsonl(tmp_path / "in.jsonl", events)
    app = Application("bad-times")
    (app.source("jsonl", path=str(tmp_path / "in.jsonl"))
        .key_by("car").window("1s", aggregates={"n": ("count", "speed")})
        .sink("jsonl", path=str(tmp_path / "out.jsonl")))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=WAIT)
        dead = dep.dead_letters()
    expected = Counter((e["car"], (e["ts"] - T0) // 1000 * 1000 + T0) for e in good)
    assert windows(tmp_path / "out.jsonl") == expected
    assert status["state"] == "finished" and status["dead_letters"] == len(BAD)
    assert sorted(d["item"]["speed"] for d in dead) == [-5, -4, -3, -2, -1]
    assert all("event time" in d["error"] and d["op"] == "jsonl-1" for d in dead), dead


def test_seconds_in_another_field_drive_windows_in_milliseconds(cluster, tmp_path):
    events = [{"car": "c0", "speed": i, "at": (T0 + i * 250) / 1000} for i in range(40)]
    write_jsonl(tmp_path / "in.jsonl", events)
    app = Application("seconds")
    (app.source("jsonl", path=str(tmp_path / "in.jsonl"), ts_field="at", ts_unit="s", max_delay="0s")
        .key_by("car").window("1s", aggregates={"n": ("count", "speed")})
        .sink("jsonl", path=str(tmp_path / "out.jsonl")))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=WAIT)
    assert windows(tmp_path / "out.jsonl") == Counter({("c0", T0 + s * 1000): 4 for s in range(10)})
    assert status["dead_letters"] == 0 and status["late_events"] == 0


def test_an_endless_run_that_dead_letters_everything_fails_within_a_few_monitor_windows(cluster):
    """Every event lacks its time (``ts_field`` names no field): over dead-letters.max-ratio, the
    endless run fails loudly while it runs, naming the operator and the ratio."""
    from pescheduler.errors import DeploymentFailed

    app = Application("all-dead")
    app.source("generator", rate=2000, ts_field="when").key_by("car").window("1s", aggregates={
        "n": ("count", "speed")}).sink("discard")
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        with pytest.raises(DeploymentFailed, match=r"generator-1 dead-lettered \d+ of \d+ tuples \(100%.*max-ratio 0.5"):
            dep.wait(timeout=WAIT)
        status = dep.status()
    running = next(e["t"] for e in status["events"] if e["kind"] in ("deploy", "running", "start")) \
        if any(e["kind"] in ("deploy", "running", "start") for e in status["events"]) else 0.0
    failed = next(e["t"] for e in status["events"] if e["kind"] == "dead letters")
    assert failed - running < 10, status["events"]
    assert status["state"] == "failed" and status["dead_letters"] >= 1000


def test_bad_event_times_in_arrow_batches_are_dead_letters_and_every_window_is_exact(cluster, tmp_path):
    """A columnar source (parquet read as Arrow record batches): a null, NaN or infinite time in
    a float column is a dead letter with the reason, the valid rows of the same batch go on, and
    every window is exact (a NaN made the batch's maximum NaN and the watermark never moved)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = [{"car": f"c{i % 3}", "speed": i, "ts": float(T0 + i * 100)} for i in range(180)]
    bad = [{"car": "c0", "speed": -2, "ts": None}, {"car": "c0", "speed": -4, "ts": float("nan")},
           {"car": "c0", "speed": -5, "ts": float("inf")}, {"car": "c0", "speed": -6, "ts": float("-inf")}]
    pq.write_table(pa.Table.from_pylist(good[:40] + bad + good[40:]), tmp_path / "in.parquet")
    app = Application("bad-arrow-times")
    (app.source("files", path=str(tmp_path / "in.parquet"), columnar=True)
        .key_by("car").window("1s", aggregates={"n": ("count", "speed")})
        .sink("jsonl", path=str(tmp_path / "out.jsonl")))
    with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
        status = dep.wait(timeout=WAIT)
        dead = dep.dead_letters()
    expected = Counter((e["car"], (int(e["ts"]) - T0) // 1000 * 1000 + T0) for e in good)
    assert windows(tmp_path / "out.jsonl") == expected
    assert status["state"] == "finished" and status["dead_letters"] == len(bad)
    assert sorted(d["item"]["speed"] for d in dead) == [-6, -5, -4, -2]
    assert all("bad event time: 'ts' is" in d["error"] and d["op"] == "files-1" for d in dead), dead


GOOD = 30_000                 # events before the input turns bad: 15 s at the generator's 2000/s
WINDOW = 4_000                # dead-letters.window for the late burst: 2 s of input


def turns_bad(t: dict) -> dict:
    """Good for the generator's first ``GOOD`` events (1 ms apart from ``T0``), then every one raises."""
    if t["ts"] >= T0 + GOOD:
        raise ValueError(f"bad input: event at {t['ts']}")
    return t


def test_a_late_dead_letter_burst_fails_an_endless_run_within_a_monitor_window_or_two(cluster):
    """Issue 31, finding 12: an endless run whose input turns bad after ``GOOD`` good events (every
    later one a dead letter) fails while it runs, a few monitor windows after its first dead letter,
    with the reason in ``status``: judged over its recent tuples (``dead-letters.window``), not over
    the run's whole life, where the good start would hide the burst for as long as it lasted."""
    import dask

    from pescheduler.errors import DeploymentFailed

    app = Application("late-burst")
    app.source("generator", rate=2000).map(turns_bad).sink("discard")
    with dask.config.set({"pescheduler.dead-letters.window": WINDOW, "pescheduler.monitor.interval": "1s"}):
        with pescheduler.deploy(app, cluster=cluster, policies=[]) as dep:
            with pytest.raises(DeploymentFailed, match=r"map-\d+ dead-lettered \d+ of \d+ recent tuples"):
                dep.wait(timeout=60)
            status = dep.status()
    first_dead = next(e["t"] for e in status["events"] if e["kind"] == "error" and "ValueError" in e["text"])
    failed = next(e for e in status["events"] if e["kind"] == "dead letters")
    assert status["state"] == "failed" and "max-ratio" in status["error"], status["events"]
    assert first_dead > 5, "the input turned bad only after a long good start"
    # Within about a window of bad tuples (dead-lettering runs at a few hundred a second here, the
    # time it takes is theirs), not once the bad ones outnumber the GOOD good ones.
    assert status["dead_letters"] <= 2 * WINDOW, status["events"]
    assert failed["t"] - first_dead <= 30, status["events"]
