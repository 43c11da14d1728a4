"""Local recovery's copies on a machine with two workers: each worker's copies are its own.

Both workers of an embedded cluster share the machine's ``pescheduler.state.dir``. A worker keeps a
copy of every key-group file it writes and, as each checkpoint completes, removes the copies no
chain of its own references any more (``state/local.py``): the other worker's must not be among
them, nor may one worker's end of the deployment remove the other's stores.
"""

from __future__ import annotations

import glob
import os
import re
import signal

import pytest

import pescheduler
from pescheduler import Application, Move, Replicate
from support_ops import copy_holds, replicated
from test_copies import until           # the next monitor snapshot where a predicate holds
from waiting import until as polled

pytestmark = pytest.mark.integration

RATE = 20_000
COUNT = 60_000
KEYS = 20_000           # about 150 keys a key group: its files go into the PE's segment, not its .state


def _copies_of(state_dir, run: str, checkpoint_id: int) -> dict[str, list[int]]:
    """``{file name: [size of each worker's copy]}`` of checkpoint ``checkpoint_id`` on this machine."""
    found: dict[str, list[int]] = {}
    pattern = os.path.join(glob.escape(str(state_dir)), "pescheduler-state", "**", "checkpoint-copies",
                           run, f"chk-{checkpoint_id:06d}", "*")
    for path in glob.glob(pattern, recursive=True):
        found.setdefault(os.path.basename(path), []).append(os.path.getsize(path))
    return found


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_each_workers_copies_outlive_the_other_workers_checkpoints(tmp_path, monkeypatch, backend):
    """A count window and its copy on two workers of one machine: after a checkpoint completes,
    the segment each of them wrote has its copy on this machine, whole. Before, each worker's
    removal of copies no chain of its own referenced took the other's: a PE restored on the worker
    that wrote its files read them all from the storage."""
    state_dir = tmp_path / "state"
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(state_dir))      # the forked workers' setting
    release, storage = tmp_path / "go-on", tmp_path / "ckpt"
    app = Application(f"copies-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE, **copy_holds(release, COUNT, COUNT // 3))
        .key_by("key").window(count=10, aggregates={"total": ("sum", "n")})
        .sink("jsonl", path=str(tmp_path / "windows.jsonl")))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend,
                            checkpoint=str(storage), checkpoint_interval="1h") as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        until(dep, lambda s: op in s.operators and s.operators[op].tuples_in > 0, "the window counts")
        assert dep.apply(Replicate(op, 1)).applied
        replicated(release)
        until(dep, lambda s: s.operators.get(f"{op}#1") and s.operators[f"{op}#1"].tuples_in > 0,
              "the copy counts")
        placement = dep.placement()
        original, copy = placement.pe_of(op), placement.pe_of(f"{op}#1")
        if placement.pes[copy].worker == placement.pes[original].worker:
            there = next(w for w in placement.workers if w != placement.pes[original].worker)
            assert dep.apply(Move(copy, there)).applied
        placement = dep.placement()
        assert placement.pes[copy].worker != placement.pes[original].worker
        checkpoint_id = dep.checkpoint(timeout=120)         # the first: every group written whole
        (run,) = [os.path.basename(p) for p in glob.glob(str(storage / "run-*"))]
        written = {os.path.basename(p): os.path.getsize(p)
                   for p in glob.glob(str(storage / run / f"chk-{checkpoint_id:06d}" / "*.seg*"))}
        copies = _copies_of(state_dir, run, checkpoint_id)
        release.touch()
        assert dep.wait(timeout=120)["state"] == "finished"
    writers = {name.rsplit(".seg", 1)[0] for name in written}
    assert writers == {original, copy}, written          # each instance wrote a segment
    assert {name: copies.get(name) for name in written} == {name: [size] for name, size in written.items()}


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_pe_restored_on_the_worker_that_wrote_its_files_reads_them_from_its_copies(tmp_path, monkeypatch, backend):
    """The source's worker SIGKILLed, the recovery restores everything on the window's worker, which
    wrote the window's files: its restore reads every one of them from that worker's copies (the
    event says how many, and none from the storage). Before, the recovery's stop of the old PEs
    removed the deployment's directory on each worker, copies and all, and the restore read every
    file from the storage."""
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "state"))
    app = Application(f"local-recovery-{backend}")
    (app.source("numbers", count=COUNT, keys=KEYS, rate=RATE // 4)
        .key_by("key").window(count=10, aggregates={"total": ("sum", "n")})
        .sink("jsonl", path=str(tmp_path / "windows.jsonl")))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend,
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.5s") as dep:
        placement = dep.placement()
        op = next(x for x in placement.plan.ops if x.startswith("count_window"))
        source = next(x for x in placement.plan.ops if x.startswith("numbers"))
        window_worker, source_worker = (placement.pes[placement.pe_of(x)].worker for x in (op, source))
        assert window_worker != source_worker, placement.pes
        polled(lambda: dep.checkpoints(), 120, "a complete checkpoint")
        os.kill(dep.worker_info[source_worker]["pid"], signal.SIGKILL)
        polled(lambda: any(e["kind"] == "restored" for e in dep.status()["events"]), 120, "the groups in")
        restored = [e["text"] for e in dep.status()["events"] if e["kind"] == "restored"]
        assert dep.wait(timeout=120)["state"] == "finished"
    assert len(restored) == 1, restored
    found = re.search(r"\((\d+) files read from its worker's copies, (\d+) from the storage\)", restored[0])
    assert found and int(found.group(1)) > 0 and int(found.group(2)) == 0, restored[0]
