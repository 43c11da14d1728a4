"""A checkpoint's key-group files of one PE in one segment file (pescheduler/state/files.py ``Segment``).

At 10^7 keys a steady checkpoint wrote about 130 files a PE (a delta or a full file per key
group), each a new inode and an fsync, and as many local copies: a fifth of the writer's CPU
(docs/state-log.md, session 55). Each file is now a range of its PE's segment: written back to back,
synced once, read and checked by range, kept by retention and local recovery while any entry in
it is referenced. Real local-directory storage, the real CheckpointStore and worker side.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import dask.config
import pytest
from keyed_stores import restored_state, state, unpacked, worker_dir  # noqa: F401  (fixtures)
from test_incremental_checkpoint import KEY, checkpoint, fill, restored

from pescheduler.checkpoint import CheckpointStore
from pescheduler.errors import CheckpointDamaged
from pescheduler.state.files import Segment, physical
from pescheduler.state.local import LocalCopies
from pescheduler.state.settings import deployment_dir
from pescheduler.worker.ckpt_files import CheckpointFiles

K = 20_000


def names(store: CheckpointStore, checkpoint_id: int) -> list[str]:
    folder = os.path.join(store.root, store.run, f"chk-{checkpoint_id:06d}")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def change(state, step: int, tag: int) -> dict:
    """Every ``step``-th key a new value of 64 hex digits (a delta of a group past 1 KB); the model."""
    model = {}
    for i in range(0, K, step):
        model[f"car-{i:07d}"] = [i, f"{tag:04d}{i:060d}"]
        state.put(f"car-{i:07d}", model[f"car-{i:07d}"])
    return model


@pytest.mark.usefixtures("unpacked")
def test_a_checkpoints_group_files_are_ranges_of_one_segment_a_pe_kept_while_referenced(state, tmp_path, worker_dir):
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    fill(state, K)
    checkpoint(files, store, state, 1)
    assert names(store, 1) == ["MANIFEST.json", "pe.seg0", "pe.state"], f"{len(names(store, 1))} files in chk-000001"
    model = {f"car-{i:07d}": [i, 1.0] for i in range(K)} | change(state, 5, 2)
    second = checkpoint(files, store, state, 2)
    assert names(store, 2) == ["MANIFEST.json", "pe.seg0", "pe.state"], f"{len(names(store, 2))} files in chk-000002"
    ranges = sorted((f["at"], f["bytes"]) for f in second["files"] if f["chk"] == 2 and f["role"] == "group")
    assert len(ranges) == 128 and all(f["path"].endswith(".delta") for f in second["files"]
                                      if f["chk"] == 2 and f["role"] == "group")
    ends = [at + size for at, size in ranges]
    assert [at for at, _ in ranges] == [0, *ends[:-1]]          # back to back, nothing between
    assert os.path.getsize(os.path.join(store.root, store.run, "chk-000002", "pe.seg0")) == ends[-1]
    store.verify(2)
    assert restored(store, 2) == model
    store.prune(1)                                              # 2's chains start in 1's segment
    assert "pe.seg0" in names(store, 1) and "MANIFEST.json" not in names(store, 1), names(store, 1)
    model |= change(state, 5, 3)
    with dask.config.set({"pescheduler.checkpoint.max-deltas": 1}):     # every group's turn: all whole
        last = checkpoint(files, store, state, 3)
    assert {f["chk"] for f in last["files"] if f["role"] == "group"} == {3}
    store.prune(1)
    assert "pe.seg0" not in names(store, 1) + names(store, 2), (names(store, 1), names(store, 2))
    copies = Path(deployment_dir("d")) / "checkpoint-copies" / store.run
    assert sorted(str(p.relative_to(copies)) for p in copies.rglob("*.seg*")) == \
        sorted({physical(f) for f in last["files"] if f.get("in")})
    assert restored(store, 3) == model


@pytest.mark.usefixtures("unpacked")
def test_a_segment_cut_short_is_named_by_the_entry_it_no_longer_holds(state, tmp_path):
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    fill(state, K)
    out = checkpoint(files, store, state, 1)
    last = max((f for f in out["files"] if f.get("in")), key=lambda f: f["at"])
    with open(os.path.join(store.root, store.run, physical(last)), "r+b") as f:
        f.truncate(last["at"] + last["bytes"] - 1)
    with pytest.raises(CheckpointDamaged, match=f"its manifest says {last['path']} ends at byte "
                                                f"{last['at'] + last['bytes']}"):
        store.verify(1)
    with pytest.raises(CheckpointDamaged, match=f"{last['path']} \\(bytes {last['at']}-"):
        store.files.read(last, store.run)


@pytest.mark.usefixtures("unpacked")
def test_a_segment_that_cannot_be_synced_leaves_no_chain_naming_it(state, tmp_path, monkeypatch):
    """The sync at a segment's end fails: the write fails loudly, and the next attempt builds on
    none of its files (the chains the attempt kept name bytes that may not be on disk)."""
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    fill(state, K)
    checkpoint(files, store, state, 1)
    model = {f"car-{i:07d}": [i, 1.0] for i in range(K)} | change(state, 5, 2)
    real_fsync, failed = os.fsync, []

    def fsync(fd):
        if not failed:                              # the first sync of checkpoint 2: its segment's
            failed.append(os.readlink(f"/proc/self/fd/{fd}"))
            raise OSError(5, "Input/output error")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        checkpoint(files, store, state, 2, complete=False)
    assert failed[0].endswith("chk-000002/pe.seg0")
    third = checkpoint(files, store, state, 3)
    assert not [f["path"] for f in third["files"] if f["chk"] == 2], "checkpoint 3 names the unsynced segment's files"
    assert restored(store, 3) == model


@pytest.mark.usefixtures("unpacked")
def test_a_write_still_going_holds_the_next_checkpoints_write_until_its_segment_is_synced(state, tmp_path,
                                                                                          monkeypatch):
    """An aborted checkpoint's write may still be going when the next one's begins (a thread each,
    ``pe_ckpt_write``); the next one may name the files the first keeps, which are durable only
    once its segment is synced. So a worker writes one checkpoint at a time."""
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    fill(state, K)
    checkpoint(files, store, state, 1)
    change(state, 5, 2)
    put, events, inside, release = Segment.put, [], threading.Event(), threading.Event()

    def held(self, name, data):
        if self.checkpoint_id == 2 and not inside.is_set():
            inside.set()
            assert release.wait(30)
        events.append(self.checkpoint_id)
        return put(self, name, data)

    monkeypatch.setattr(Segment, "put", held)
    first = threading.Thread(target=checkpoint, args=(files, store, state, 2), kwargs={"complete": False})
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=checkpoint, args=(files, store, state, 3), kwargs={"complete": False})
    second.start()
    second.join(2)                                  # it waits for the first (a write of ~130 files
    events.append("released")                       # when it does not: well under this)
    release.set()
    first.join(30), second.join(30)
    assert not first.is_alive() and not second.is_alive()
    assert 3 in events and events.index(3) > events.index("released"), events[:5]


@pytest.mark.usefixtures("unpacked")
def test_the_end_of_a_checkpoint_leaves_the_copies_of_the_next_one_being_written(state, tmp_path, monkeypatch):
    """Checkpoint 2 ends (its chains confirmed, this worker's copies pruned) while checkpoint 3's
    write has copied its first file here and named it in no chain yet: the copy of 3's segment
    stays, and every file of 3 is read from this worker's copies."""
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    fill(state, K)
    checkpoint(files, store, state, 1)
    change(state, 5, 2)
    second = checkpoint(files, store, state, 2, complete=False)     # written, not ended yet
    change(state, 5, 3)
    keep, inside, release, out = LocalCopies.keep, threading.Event(), threading.Event(), {}

    def held(self, run, entry, data):
        keep(self, run, entry, data)
        if entry["chk"] == 3 and not inside.is_set():
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(LocalCopies, "keep", held)
    third = threading.Thread(target=lambda: out.update(checkpoint(files, store, state, 3, complete=False)))
    third.start()
    assert inside.wait(30)
    store.commit_manifest(2, {"id": 2, "files": second["files"]})
    files.end("d", 2, complete=True)                # prunes this worker's copies meanwhile
    release.set()
    third.join(30)
    assert not third.is_alive() and "files" in out, out
    written = [f for f in out["files"] if f["chk"] == 3 and f.get("in")]
    local = LocalCopies(deployment_dir("d"))
    lost = [f["path"] for f in written if local.read(store.run, f) is None]
    assert written and not lost, f"{len(lost)} of {len(written)} copies of checkpoint 3's files lost: {lost[:3]}"
