"""Issue 31: checkpoint storage you can trust, broken on purpose against real clusters and real files.

Each test runs real deployments (embedded Dask clusters, worker processes
killed by PID) over one checkpoint directory and damages it as an outsider
or a crash would: a tampered state file (a pickle that would run code), a
truncated one, an empty one next to its MANIFEST, a removal that fails while
pruning, two runs of one app at once, and a fresh run that loses a worker
before its own first checkpoint. The output of the ``jsonl`` sink (two-phase
under checkpoints) is compared with the plain-Python reference exactly, or
the failure must be loud.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import stat
from pathlib import Path

import dask.config
import pytest

import pescheduler
from pescheduler import Application, DeploymentFailed
from pescheduler.checkpoint.storage import CheckpointStore
from support_ops import committed_output
from waiting import manifests, until

pytestmark = pytest.mark.integration

WAIT = 120
COUNT = 6_000


def app(out: Path, count: int = COUNT, rate: int = 3_000, name: str = "durable", **held) -> Application:
    a = Application(name)
    (a.source("numbers", count=count, keys=10, rate=rate, **held)
        .map(lambda e: {"n": e["n"], "square": e["n"] * e["n"]})
        .sink("jsonl", path=str(out)))
    return a


def expected(count: int = COUNT) -> list[dict]:
    return [{"n": i, "square": i * i} for i in range(count)]


def deploy(application, storage: Path, **kw):
    return pescheduler.deploy(application, workers=2, plugins=["support_ops"], policies=[],
                              checkpoint=str(storage), **kw)


def finished_run(tmp_path: Path) -> tuple[Path, Path]:
    """A first run that took several checkpoints and ended: its output file and the storage. Its
    source holds halfway until two checkpoints are complete: run at its rate alone, a loaded
    machine (two busy loops beside the suite) once finished the 2 s stream after one."""
    out, storage, release = tmp_path / "out.jsonl", tmp_path / "ckpt", tmp_path / "release"
    with deploy(app(out, hold_at=COUNT // 2, release=str(release)), storage, checkpoint_interval="0.2s") as dep:
        until(lambda: len(dep.checkpoints()) >= 2, WAIT, "two complete checkpoints of the first run")
        release.touch()
        dep.wait(timeout=WAIT)
        assert len(dep.checkpoints()) >= 2, dep.checkpoints()
    assert committed_output(out) == expected()
    return out, storage


class _Touch:
    """Unpickling this creates a file: what an outsider's pickle would do with write access."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _damage(state_file: Path, how: str, marker: Path) -> None:
    size = state_file.stat().st_size
    if how == "tampered":            # same size (pickle ignores what follows its STOP), other bytes
        evil = pickle.dumps(_Touch(str(marker)))
        assert len(evil) <= size
        state_file.write_bytes(evil + b"\0" * (size - len(evil)))
    elif how == "truncated":
        state_file.write_bytes(state_file.read_bytes()[: size // 2])
    else:
        state_file.write_bytes(b"")


@pytest.mark.parametrize("how", ["tampered", "truncated", "empty"])
def test_a_damaged_newest_checkpoint_is_never_loaded_and_the_restore_falls_back(tmp_path, how, caplog):
    """The newest checkpoint's state file is damaged after the run; ``restore="latest"`` must not
    unpickle it (a tampered one would run the outsider's code), must say why it is skipped, and
    must restore the previous complete checkpoint: the output is still exact."""
    out, storage = finished_run(tmp_path)
    newest = manifests(storage)[-1].parent
    marker = tmp_path / "outsider-code-ran"
    _damage(next(newest.glob("*.state")), how, marker)
    try:
        with deploy(app(out), storage, restore="latest") as dep:
            restored_from = dep.wait(timeout=WAIT)["checkpoints"].get("restored_from")
    finally:
        assert not marker.exists(), "an unsigned pickle from the checkpoint storage was loaded"
    assert restored_from.endswith(f"/{int(newest.name[4:]) - 1}"), restored_from
    assert any(newest.name[4:].lstrip("0") in r.getMessage() and ("damaged" in r.getMessage()
               or "skipped" in r.getMessage()) for r in caplog.records if r.levelname == "WARNING")
    assert committed_output(out) == expected()


def test_checkpoint_files_are_owner_only_and_hold_no_secret_parameters(tmp_path):
    """Files 0600, directories 0700; an operator parameter named like a password never reaches
    the storage (the placement is stored without parameters)."""
    out, storage = tmp_path / "out.jsonl", tmp_path / "ckpt"
    a = Application("secretive")
    (a.source("numbers", count=3_000, keys=10, rate=3_000,       # a URL with a password, as a connector's
              release="redis://user:hunter2-do-not-store@127.0.0.1/0")
        .sink("jsonl", path=str(out)))
    with deploy(a, storage, checkpoint_interval="0.2s") as dep:
        dep.wait(timeout=WAIT)
    files = [p for p in storage.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), \
        {str(p): oct(p.stat().st_mode) for p in files}
    dirs = [p for p in storage.rglob("*") if p.is_dir()]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in dirs), {str(p): oct(p.stat().st_mode) for p in dirs}
    assert not [p for p in files if b"hunter2-do-not-store" in p.read_bytes()]


def test_a_fresh_run_that_loses_a_worker_before_its_first_checkpoint_does_not_restore_another_run(tmp_path):
    """A previous run left complete checkpoints in the directory; a new run of the same app,
    started without ``restore=``, loses a worker before it took one of its own. It has nothing
    of its own to restore: it fails loudly rather than going on from the other run's state."""
    out, storage = finished_run(tmp_path)
    again = tmp_path / "again.jsonl"
    with deploy(app(again, count=60_000, rate=2_000), storage, checkpoint_interval="600s") as dep:
        until(lambda: any(s["operators"].get("map-2", {}).get("tuples_in", 0) for s in dep.pe_stats().values()),
              WAIT, "the new run's first tuples")
        worker = dep.placement().pes[dep.placement().pe_of("map-2")].worker
        os.kill(dep.worker_info[worker]["pid"], signal.SIGKILL)
        with pytest.raises(DeploymentFailed, match="lost worker"):
            dep.wait(timeout=WAIT)
        assert dep.status()["checkpoints"]["restart"]["restarts"] == []


def test_two_runs_of_one_app_at_once_keep_their_own_checkpoints(tmp_path):
    """Two runs checkpoint into one directory at the same time, keeping one checkpoint each: neither
    prunes nor overwrites the other's, and each one's last checkpoint is its own. (Their apps are
    named apart: one running deployment per name is refused on its own account.)"""
    storage = tmp_path / "ckpt"
    with dask.config.set({"pescheduler.checkpoint.retain": 1}):
        with deploy(app(tmp_path / "a.jsonl", 10**9, name="run-a"), storage, checkpoint_interval="0.1s") as a, \
                deploy(app(tmp_path / "b.jsonl", 10**9, name="run-b"), storage, checkpoint_interval="0.1s") as b:
            # Until each completed two, whatever the load (a 3 s run loaded to 10 had completed none).
            until(lambda: min(len(a.checkpoints()), len(b.checkpoints())) >= 2, WAIT, "two checkpoints of each run")
    # Read once both ended: a checkpoint whose manifest was being written as its run ended is
    # listed by the end, which prunes the one before it (retain 1); read before, that one was named.
    lasts = {dep.id: dep.checkpoints()[-1]["url"] for dep in (a, b)}
    for deployment, url in lasts.items():
        manifest = json.loads((Path(url) / "MANIFEST.json").read_text())
        assert manifest["deployment"] == deployment
    for out in (tmp_path / "a.jsonl", tmp_path / "b.jsonl"):   # stopped: drained, all committed
        rows = committed_output(out)
        assert rows and rows == expected(len(rows))


def test_a_pruning_failure_is_logged_and_retried_and_checkpoints_go_on(tmp_path, monkeypatch, caplog):
    """Removing old checkpoints fails (a storage error) for a while: checkpointing goes on, the
    status says why, and the old ones are removed once the storage lets them be."""
    real, failures = CheckpointStore._drop, {"left": 4}

    def flaky(self, checkpoint_id, *args):      # each old checkpoint's removal (its directory, or all
        if failures["left"] > 0:                # but what kept ones reference or walk)
            failures["left"] -= 1
            raise PermissionError(13, "Permission denied (injected)")
        return real(self, checkpoint_id, *args)

    monkeypatch.setattr(CheckpointStore, "_drop", flaky)
    out, storage = tmp_path / "out.jsonl", tmp_path / "ckpt"
    with deploy(app(out, count=30_000), storage, checkpoint_interval="0.1s") as dep:
        until(lambda: dep.status()["checkpoints"]["completed"] >= 10, WAIT, "checkpoints going on after failures")
        assert failures["left"] == 0 and dep.status()["state"] == "running"
        dep.wait(timeout=WAIT)
        retained = len(dep.checkpoints()[-3:])
    assert any("pruning old checkpoints failed" in r.getMessage() for r in caplog.records)
    assert len(manifests(storage)) == retained == 3
    assert committed_output(out) == expected(30_000)


def test_a_run_started_from_another_runs_checkpoint_restores_it_after_a_loss_before_its_own(tmp_path):
    """The exception to "a recovery restores only its own run's checkpoints": the one the run was
    explicitly started from. A run restored from the newest checkpoint of a run stopped mid-stream
    loses a worker before its own first checkpoint: it restores that one again, exactly."""
    out, storage = tmp_path / "out.jsonl", tmp_path / "ckpt"
    with deploy(app(out, count=20_000), storage, checkpoint_interval="0.3s") as first:
        until(lambda: len(first.checkpoints()) >= 2, WAIT, "two checkpoints of the first run")
    with deploy(app(out, count=20_000), storage, restore="latest", checkpoint_interval="600s") as dep:
        origin = dep.status()["checkpoints"]["restored_from"]
        until(lambda: any(s["operators"].get("map-2", {}).get("tuples_in", 0) for s in dep.pe_stats().values()),
              WAIT, "the restored run's first tuples")
        worker = dep.placement().pes[dep.placement().pe_of("map-2")].worker
        os.kill(dep.worker_info[worker]["pid"], signal.SIGKILL)
        dep.wait(timeout=WAIT)
        restarts = dep.status()["checkpoints"]["restart"]["restarts"]
    assert [f"{origin.rsplit('/', 1)[0]}/{r['checkpoint']}" for r in restarts] == [origin]
    assert committed_output(out) == expected(20_000)


def test_a_large_state_is_checkpointed_without_passing_through_the_deploying_process(tmp_path):
    """Issue 31, finding 9 (and issue 30): every PE's state passed through the deploying process,
    which had to hold about twice the total state at each checkpoint. A window holding about
    60 MB (60,000 keys, a 1 KB value each) is checkpointed three times: the files hold it, and the deploying
    process (this one: the workers are forked processes) grows by far less than it."""
    import threading

    import psutil

    n, release, out = 60_000, tmp_path / "release", tmp_path / "out.jsonl"
    app = Application("big-state")
    (app.source("numbers", count=n + 10, keys=n, hold_at=n, release=str(release))
        .map(lambda e: {**e, "p": str(e["n"]).rjust(1_000, "x")})
        .key_by("key").window(size="1h", aggregates={"m": ("max", "p")})
        .sink("jsonl", path=str(out)))
    me, peak, sampling = psutil.Process(), [0], threading.Event()

    def sample():                                    # the deploying process's resident size, at 100 Hz
        while not sampling.wait(0.01):
            peak[0] = max(peak[0], me.memory_info().rss)

    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[],
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="1h") as dep:
        until(lambda: sum(o["tuples_in"] for o in dep.status()["operators"] if o["op"].startswith("window")) >= n,
              WAIT, "the window to hold every payload")
        base = me.memory_info().rss
        thread = threading.Thread(target=sample)
        thread.start()
        try:
            for _ in range(3):
                dep.checkpoint(timeout=WAIT)
        finally:
            sampling.set()
            thread.join(10)
        release.write_text("")
        dep.wait(timeout=WAIT)
    stored = sum(f.stat().st_size for f in (tmp_path / "ckpt").rglob("*") if f.is_file())
    assert stored > 50e6, f"the checkpoints hold {stored / 1e6:.0f} MB: the state was not large"
    assert peak[0] - base < 20e6, f"the deploying process grew by {(peak[0] - base) / 1e6:.0f} MB"
