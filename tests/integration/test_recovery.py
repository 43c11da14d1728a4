"""Issue 13: a SIGKILLed worker, or a SIGKILLed deploying process, loses nothing and repeats nothing.

Each test streams for several seconds on a real embedded cluster, waits for a
complete checkpoint, kills a real process by PID mid-stream, and compares
what the sink made visible with a plain-Python reference, exactly. The sink
is the built-in ``jsonl``, two-phase under checkpoints (staged per checkpoint,
appended to the file on commit, cut back on restore), so the file itself is
the exactly-once output, also after ``--restore latest`` in a new process. The tests of a keyed
window run on both keyed-state backends (``state="memory"|"disk"``, issue 30).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dask.config
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pescheduler
from pescheduler import Application, Fuse, Move, Replicate
from support_ops import committed_output, committed_windows, count_sum_windows, last_checkpoint, rocksdb_stores
from waiting import gone, manifests, newest_checkpoint, until

pytestmark = pytest.mark.integration

WAIT = 120                    # a bound on every wait
TESTS = str(Path(__file__).parent.parent)


BACKENDS = pytest.mark.parametrize("backend", ["memory", "disk"])


def kill_worker_of(dep, op_id: str, backend: str | None = None) -> str:
    """SIGKILL the worker process running ``op_id``, once a checkpoint is complete; its address.
    With ``backend``, first check the keyed state is where it says (RocksDB stores for ``disk``)."""
    until(lambda: dep.checkpoints(), WAIT, "a complete checkpoint")
    if backend is not None:
        stores = rocksdb_stores(dep.id)
        assert bool(stores) == (backend == "disk"), f"{backend} backend, RocksDB stores: {stores}"
    placement = dep.placement()
    worker = placement.pes[placement.pe_of(op_id)].worker
    os.kill(dep.worker_info[worker]["pid"], signal.SIGKILL)
    return worker


def restarted(dep) -> dict:
    restarts = dep.status()["checkpoints"]["restart"]["restarts"]
    assert restarts, "no restart was recorded"
    return restarts[-1]


def test_stateless_chain_killed_mid_stream_gives_every_tuple_exactly_once(tmp_path):
    out = tmp_path / "out.jsonl"
    app = Application("stateless")
    (app.source("numbers", count=30_000, keys=10, rate=3_000)
        .map(lambda e: {"n": e["n"], "twice": e["n"] * 2})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[],
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.5s") as dep:
        kill_worker_of(dep, "map-2")
        status = dep.wait(timeout=WAIT)
        record = restarted(dep)
    assert status["state"] == "finished"
    assert committed_output(out) == [{"n": i, "twice": 2 * i} for i in range(30_000)]
    assert record["checkpoint"] >= 1 and record["first_output_s"] < 30


@BACKENDS
def test_keyed_window_killed_mid_stream_matches_the_reference_exactly(tmp_path, backend):
    out = tmp_path / "out.jsonl"
    app = Application("windows")
    (app.source("numbers", count=30_000, keys=20, step=1, rate=3_000)
        .key_by("key")
        .window(size="1s", aggregates={"c": ("count", "n"), "s": ("sum", "n")})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state=backend,
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.5s") as dep:
        window = next(op for op in dep.placement().plan.ops if op.startswith("window"))
        kill_worker_of(dep, window, backend)
        # the restored window loads its key groups after its first output: the status says how far
        # until its worker reports them all in (the event), then nothing
        until(lambda: any(e["kind"] == "restored" for e in dep.status()["events"]), WAIT, "the groups in")
        assert dep.status()["checkpoints"]["restoring"] == {}
        dep.wait(timeout=WAIT)
        restarted(dep)
    assert committed_windows(out) == count_sum_windows(30_000, 20)


def test_a_window_restored_from_its_checkpoints_deltas_after_a_kill_matches_the_reference(tmp_path):
    """A memory time window whose panes live across many checkpoints (10 s of event time, 3.3 s
    of the stream; checkpoints every 0.3 s) writes the keys changed as deltas after its first
    checkpoints (docs/state-log.md, "A window's checkpoint writes what changed"); its worker is
    SIGKILLed once five are complete, and the restore from full files and deltas is exact (each
    checkpoint wrote a third of the state it references or more before: the window whole, 11-51 KB
    of 19-81 KB)."""
    out = tmp_path / "out.jsonl"
    app = Application("window-deltas")
    (app.source("numbers", count=40_000, keys=20_000, step=1, rate=3_000)     # 900 keys a checkpoint
        .key_by("key")
        .window(size="10s", aggregates={"c": ("count", "n"), "s": ("sum", "n")})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state="memory",
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.3s") as dep:
        window = next(op for op in dep.placement().plan.ops if op.startswith("window"))
        until(lambda: last_checkpoint(dep) >= 5, WAIT, "five complete checkpoints")
        written = dep.checkpoints()
        kill_worker_of(dep, window)
        dep.wait(timeout=WAIT)
        restarted(dep)
    assert any(c["bytes"] < c["state_bytes"] / 3 for c in written[1:]), \
        f"every checkpoint wrote the window whole: {[(c['bytes'], c['state_bytes']) for c in written]}"
    assert committed_windows(out) == count_sum_windows(40_000, 20_000, size_ms=10_000)


@BACKENDS
def test_a_kill_while_a_checkpoint_waits_restores_without_waiting_for_it(tmp_path, backend):
    """Checkpoints back to back (one is nearly always in flight) with a 60 s timeout: the window's
    worker is SIGKILLed, so PEs downstream never see the barrier and a call to the dead worker is
    retried by Dask until its 30 s connect timeout. The loss aborts that checkpoint at once: the
    restore takes the lock within seconds (it waited up to 33 s in bench/recovery.py before)."""
    out = tmp_path / "out.jsonl"
    app = Application("windows")
    (app.source("numbers", count=30_000, keys=20, step=1, rate=3_000)
        .key_by("key")
        .window(size="1s", aggregates={"c": ("count", "n"), "s": ("sum", "n")}, id="win")
        .sink("jsonl", path=str(out)))
    with dask.config.set({"pescheduler.checkpoint.timeout": "60s"}):
        with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state=backend,
                                checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.05s") as dep:
            kill_worker_of(dep, "win", backend)
            dep.wait(timeout=WAIT)
            record = restarted(dep)
    assert committed_windows(out) == count_sum_windows(30_000, 20)
    assert record["phases"]["lock"] < 10 and record["first_output_s"] < 20, record


def test_a_replicate_right_after_a_kill_with_no_slot_left_is_refused_naming_the_lost_worker(tmp_path):
    """2 workers, no warm slot: a Replicate while the SIGKILLed worker's recovery waits out its
    backoff needs a cold start. It is refused at once naming the lost worker (before, the cold
    start warmed every worker of the placement, the dead one too, and the call waited out Dask's
    30 s connect timeout, then raised out of ``apply``); the restore then runs and loses nothing."""
    out = tmp_path / "out.jsonl"
    app = Application("kill-replicate")
    (app.source("numbers", count=30_000, keys=10, rate=3_000)
        .map(lambda e: {"n": e["n"]}, id="double")
        .sink("jsonl", path=str(out)))
    settings_ = {"pescheduler.standard.slots-per-host": 0, "pescheduler.restart.backoff": "5s"}
    with dask.config.set(settings_), pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[],
                                                         checkpoint=str(tmp_path / "ckpt"),
                                                         checkpoint_interval="0.5s") as dep:
        worker = kill_worker_of(dep, "double")
        until(lambda: dep.status()["checkpoints"]["restart"]["restarts"], WAIT, "the loss taken over by a recovery")
        record = dep.apply(Replicate("double", 1), timeout=WAIT)
        assert not record.applied and f"worker {worker} is lost" in record.reason, record
        status = dep.wait(timeout=WAIT)
        assert restarted(dep)["lost"] == [worker]
    assert status["state"] == "finished"
    assert committed_output(out) == [{"n": i} for i in range(30_000)]


def test_join_killed_mid_stream_reports_every_pair_once(tmp_path):
    rng = random.Random(3)
    left = [{"k": rng.randrange(5), "a": i, "ts": i * 10} for i in range(3_000)]
    right = sorted(({"k": rng.randrange(5), "b": i, "ts": i * 10 + rng.randrange(-30, 30)} for i in range(3_000)),
                   key=lambda e: e["ts"])
    out = tmp_path / "out.jsonl"
    app = Application("join")
    lhs = app.source("iterable", items=left, rate=400)
    rhs = app.source("iterable", items=right, rate=400)
    lhs.join(rhs, within=25, on="k", id="pairs").sink("jsonl", path=str(out))
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[],
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.5s") as dep:
        kill_worker_of(dep, "pairs")
        status = dep.wait(timeout=WAIT)
        restarted(dep)
    assert status["late_events"] == 0
    got = sorted((r["left"]["a"], r["right"]["b"]) for r in committed_output(out))
    expected = sorted((x["a"], y["b"]) for x in left for y in right
                      if x["k"] == y["k"] and abs(x["ts"] - y["ts"]) <= 25)
    assert got == expected and len(got) > 500


@BACKENDS
def test_reconfigurations_before_and_after_a_kill_keep_the_windows_exact(tmp_path, backend):
    """A Move and a Fuse take the Reconfigurer's lock as checkpoints do: a checkpoint after a move
    restores onto the moved layout's operators, and the restored job reconfigures again."""
    out = tmp_path / "out.jsonl"
    app = Application("reconfigured")
    (app.source("numbers", count=40_000, keys=20, step=1, rate=3_000)
        .map(lambda e: {**e, "n": e["n"]}, id="m")
        .key_by("key")
        .window(size="1s", aggregates={"c": ("count", "n"), "s": ("sum", "n")}, id="win")
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state=backend,
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.3s") as dep:
        pl = dep.placement()
        pe = pl.pe_of("m")
        assert dep.apply(Move(pe, next(w for w in pl.workers if w != pl.pes[pe].worker))).applied
        moved_at = last_checkpoint(dep)
        until(lambda: last_checkpoint(dep) > moved_at, WAIT, "a checkpoint after the move")
        kill_worker_of(dep, "win", backend)
        until(lambda: any("first_output_s" in r for r in dep.recovery.restarts), WAIT, "output after the restore")
        pl = dep.placement()
        a, b = pl.pe_of("m"), pl.pe_of("win")
        if a != b:
            assert dep.apply(Fuse(a, b)).applied
        dep.wait(timeout=WAIT)
    assert committed_windows(out) == count_sum_windows(40_000, 20)


@pytest.mark.scale
@BACKENDS
@settings(max_examples=max(1, round(3 * float(os.environ.get("PESCHEDULER_SCALE", "1")))), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(steps=st.lists(st.sampled_from(["kill", "move"]), min_size=2, max_size=3), data=st.data())
def test_random_kills_interleaved_with_random_reconfigurations_lose_and_repeat_nothing(backend, steps, data):
    """Kills of random workers (any PE's: source, window or sink) between random moves: three random
    runs at full scale, one in the default run (its bounded version: tests/conftest.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.jsonl")
        app = Application("interleaved")
        (app.source("numbers", count=36_000, keys=20, step=1, rate=3_000)
            .map(lambda e: e, id="m")
            .key_by("key")
            .window(size="1s", aggregates={"c": ("count", "n"), "s": ("sum", "n")}, id="win")
            .sink("jsonl", path=out))
        with pescheduler.deploy(app, workers=3, plugins=["support_ops"], policies=[], state=backend,
                                checkpoint=os.path.join(tmp, "ckpt"), checkpoint_interval="0.3s") as dep:
            for step in steps:
                seen = last_checkpoint(dep)
                until(lambda: last_checkpoint(dep) > seen or dep.status()["state"] != "running", WAIT,
                      "a checkpoint since the last step")
                if dep.status()["state"] != "running":
                    break
                pl = dep.placement()
                pe = data.draw(st.sampled_from(sorted(pl.pes)), label="pe")
                if step == "kill":
                    os.kill(dep.worker_info[pl.pes[pe].worker]["pid"], signal.SIGKILL)
                    kills = sum(1 for _ in dep.recovery.restarts) + 1
                    until(lambda: len(dep.recovery.restarts) >= kills or dep.status()["state"] != "running",
                          WAIT, "the restart (or the stream's end, when the kill came after it)")
                else:
                    others = [w for w in pl.workers if w != pl.pes[pe].worker]
                    if others:
                        dep.apply(Move(pe, data.draw(st.sampled_from(others), label="to")))
            dep.wait(timeout=WAIT)
        assert committed_windows(out) == count_sum_windows(36_000, 20)


APP = """
from pescheduler import Application

app = Application("resumable")
(app.source("numbers", count=40_000, keys=10, rate=4_000)
    .map(lambda e: {{"n": e["n"], "square": e["n"] * e["n"]}})
    .sink("jsonl", path={out!r}))
"""


def test_restore_latest_after_the_deploying_process_is_killed_continues_exactly(tmp_path):
    out, storage = tmp_path / "out.jsonl", tmp_path / "ckpt"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"), "--workers", "2", "--json",
           "--policy", "none", "--plugin", "support_ops", "--checkpoint", str(storage),
           "--checkpoint-interval", "0.5s"]
    # stderr to a file, not a pipe nobody reads while it runs (64 KB of log lines would stop the
    # deploying process mid-write; a loaded run writes about 300 bytes), so that a failed wait says
    # what the run said; a run that ended first fails at once (the suite's "two complete
    # checkpoints" timeouts of sessions 80 and 81 said nothing more)
    err = tmp_path / "first.err"
    with open(err, "w") as log:
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        until(lambda: len(manifests(storage)) >= 2 or first.poll() is not None, WAIT,
              f"two complete checkpoints (stderr: {err})")
        assert len(manifests(storage)) >= 2, \
            f"the first run ended (exit {first.returncode}) with {len(manifests(storage))} checkpoints"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nits stderr's tail: {err.read_text()[-3000:]}") from None
    finally:
        tree = [first, *psutil.Process(first.pid).children(recursive=True)]   # the deployer and its workers
        for proc in tree:
            proc.send_signal(signal.SIGKILL)
        gone([p.pid for p in tree], WAIT, "the killed deployment's processes")
    seen_before = len(committed_output(out))
    assert seen_before < 40_000                         # killed mid-stream
    resumed = subprocess.run(cmd + ["--restore", "latest"], capture_output=True, text=True, env=env, timeout=WAIT)
    assert resumed.returncode == 0, resumed.stderr
    assert committed_output(out) == [{"n": i, "square": i * i} for i in range(40_000)]


def test_restore_of_an_unknown_checkpoint_is_a_usage_error_before_any_worker_starts(tmp_path):
    (tmp_path / "app.py").write_text(APP.format(out=str(tmp_path / "out")))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                           "--plugin", "support_ops", "--checkpoint", str(tmp_path / "empty"), "--restore", "latest"],
                          capture_output=True, text=True, env=env, timeout=WAIT)
    assert done.returncode == 2 and "no complete checkpoint in" in done.stderr
    assert time.monotonic() - t0 < 30 and not (tmp_path / "out").exists()


def test_failures_again_and_again_over_a_run_are_restored_each_time_and_lose_nothing(tmp_path):
    """Issue 31, finding 8: the restart budget was 3 attempts for the run's whole life, 100 ms apart,
    never reset, so the fourth failure of a long run (a broker that drops out now and then) failed
    it. Four failures of the source's PE, each after a complete checkpoint: four restores (with
    backoff, counted in a row), and the output is every tuple exactly once."""
    out, marks, go = tmp_path / "out.jsonl", tmp_path / "marks", tmp_path / "go"
    marks.mkdir()
    fail_at = (2_000, 5_000, 8_000, 11_000)
    app = Application("failing-again")
    # Held before the first failure until a checkpoint is complete: a restore needs one. At 2,000
    # tuples/s the first failure came 1 s into the stream, and in a loaded whole run (load 4-12)
    # no checkpoint had completed by then: the run failed, with nothing to restore.
    (app.source("failing_numbers", count=14_000, keys=10, rate=2_000, fail_at=fail_at, marks=str(marks),
                hold_at=fail_at[0] - 10, release=str(go))
        .map(lambda e: {"n": e["n"], "twice": e["n"] * 2})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[],
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.3s") as dep:
        until(lambda: newest_checkpoint(dep) >= 1, WAIT, "a complete checkpoint before the first failure")
        go.touch()
        status = dep.wait(timeout=WAIT * 2)
        restarts = list(dep.recovery.restarts)
    assert status["state"] == "finished", status.get("error")
    assert sorted(p.name for p in marks.iterdir()) == sorted(f"failed-at-{n}" for n in fail_at)
    assert len(restarts) == len(fail_at), restarts
    assert committed_output(out) == [{"n": i, "twice": 2 * i} for i in range(14_000)]
