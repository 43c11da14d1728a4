"""The first checkpoint after a rescale writes the key groups that moved in from the bytes their
part brought, not read back out of the store and packed again (``state.base.Received``,
``incremental.ChainWriter._adopted``), on both backends: the files, the delta on them and an
exact restore, with and without an earlier checkpoint, and the cases where those bytes no longer
say what the group holds (taken again, replaced, outgrown). Every group file is a file of its own
here (``unpacked``), as at 10^6 keys and more; a group of at most ``PACK_DELTA`` bytes is written
whole into its PE's ``.state`` as before (the last test)."""

from __future__ import annotations

import functools
import hashlib
import pickle
import uuid

import dask
import pytest
from keyed_stores import state, unpacked, worker_dir  # noqa: F401  (fixtures)
from test_incremental_checkpoint import KEY, aborted_after, checkpoint, fill, restored

from pescheduler.checkpoint import CheckpointStore
from pescheduler.state import key_group, open_state
from pescheduler.state.groups import add_groups, loads_prepared, take_groups
from pescheduler.state.incremental import rewrite_turn
from pescheduler.worker.ckpt_files import CheckpointFiles

K = 20_000


def other(state, tmp_path):
    """A second state of ``state``'s backend (the instance the groups move to)."""
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "stores2"), "pescheduler.state.cache": "8MB"}):
        return open_state(state.backend, owner="test2")


def preparer(state, tmp_path):
    """The receiving worker's ``prepare_group`` for ``state``'s backend (``worker/lazy_restore.preparer``)."""
    if state.backend == "disk":
        from pescheduler.state.disk import prepare_group

        return functools.partial(prepare_group, where=str(tmp_path / "prepared"), cache_bytes=8 << 20)
    from pescheduler.state.memory import prepare_group

    return prepare_group


def moved(sender, receiver, groups: list[int], tmp_path) -> dict:
    """``groups`` taken out of ``sender``, pickled as a rescale's part is, unpickled and made ready
    as the receiving worker does (``loads_prepared``) and imported into ``receiver``; the part."""
    part = loads_prepared(pickle.dumps(take_groups(sender, frozenset(groups)), pickle.HIGHEST_PROTOCOL),
                          preparer(receiver, tmp_path))
    received = {g: prepared.received for g, (_key, prepared) in part.items()}
    add_groups(receiver, part)
    return received


class FullReads:
    """Counts a view's :meth:`full` calls (a group read out of the store and packed whole)."""

    def __init__(self, monkeypatch, state) -> None:
        from pescheduler.state.disk import SnapshotView
        from pescheduler.state.memory import MemoryView

        self.groups: list[int] = []
        view_type = SnapshotView if state.backend == "disk" else MemoryView
        real = view_type.full

        def full(view, group):
            self.groups.append(group)
            return real(view, group)
        monkeypatch.setattr(view_type, "full", full)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def full_files(out: dict, checkpoint_id: int) -> dict[int, dict]:
    return {int(f["path"].rsplit(".g", 1)[1][:3]): f for f in out["files"]
            if f["chk"] == checkpoint_id and f["path"].endswith(".full")}


def contents(state) -> dict:
    return {k: v for g in state.groups() for k, v in state.items(g)}


@pytest.mark.usefixtures("unpacked")
def test_a_copys_first_checkpoint_writes_the_groups_it_was_sent_as_their_bytes_and_a_delta(state, tmp_path,
                                                                                              monkeypatch):
    """A Replicate's copy: a fresh state holding only the groups a part brought, some keys written
    since. Its first checkpoint reads no group out of the store: each group's full file is the
    bytes it came as, the keys since in a delta; the restore is exact."""
    fill(state)
    groups = sorted(state.groups())[:64]
    copy = other(state, tmp_path)
    try:
        received = moved(state, copy, groups, tmp_path)
        assert all(r is not None and r.keys > 0 for r in received.values())
        changed = [f"car-{i:07d}" for i in range(0, K, 50) if key_group(f"car-{i:07d}") in received]
        for key in changed:
            copy.put(key, [key, 2.0])
        gone = changed[0]
        copy.delete(gone)
        reads = FullReads(monkeypatch, copy)
        store, files = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY), CheckpointFiles()
        out = checkpoint(files, store, copy, 1)
        assert reads.groups == [], f"groups read whole out of the store: {reads.groups}"
        fulls = full_files(out, 1)
        assert sorted(fulls) == sorted(received)
        assert all(fulls[g]["sha256"] == sha(r.data) for g, r in received.items())
        assert restored(store, 1) == contents(copy)
        assert gone not in restored(store, 1) and restored(store, 1)[changed[1]] == [changed[1], 2.0]
    finally:
        copy.close()


@pytest.mark.usefixtures("unpacked")
def test_the_groups_a_release_brings_back_are_written_from_their_bytes_and_grow_deltas(state, tmp_path, monkeypatch):
    """A Release's original: a state with a complete checkpoint of the groups it kept gets the
    others back. Its next checkpoint writes those from their bytes (a delta for the keys written
    since), the kept groups as deltas, nothing read whole; the one after grows those chains by a
    delta; both restore exactly."""
    fill(state)
    groups = sorted(state.groups())
    away = other(state, tmp_path)
    try:
        moved(state, away, groups[64:], tmp_path)                     # the Replicate: half to the copy
        store, files = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY), CheckpointFiles()
        checkpoint(files, store, state, 1)
        for i in range(0, K, 100):
            if key_group(f"car-{i:07d}") in groups[64:]:
                away.put(f"car-{i:07d}", [i, 3.0])
        received = moved(away, state, groups[64:], tmp_path)          # the Release: back to the original
        for i in range(0, K, 77):
            state.put(f"car-{i:07d}", [i, 4.0])
        reads = FullReads(monkeypatch, state)
        second = checkpoint(files, store, state, 2)
        assert reads.groups == [], f"groups read whole out of the store: {reads.groups}"
        fulls = full_files(second, 2)
        assert sorted(fulls) == groups[64:] and all(fulls[g]["sha256"] == sha(received[g].data) for g in fulls)
        assert restored(store, 2) == contents(state)
        for i in range(1, K, 97):
            state.put(f"car-{i:07d}", [i, 5.0])
        third = checkpoint(files, store, state, 3)
        turns = {g for g in groups if rewrite_turn(g, 3, dask.config.get("pescheduler.checkpoint.max-deltas"))}
        assert set(reads.groups) == set(full_files(third, 3)) <= turns      # only the groups whose turn it is
        written = {key_group(f"car-{i:07d}") for i in range(1, K, 97)}
        g = next(g for g in groups[64:] if g not in turns and g in written)
        chain = [f["chk"] for f in third["files"] if f["role"] == "group" and f".g{g:03d}." in f["path"]]
        assert chain[0] == 2 and chain[-1] == 3 and len(chain) >= 2     # the chain from its bytes, grown
        assert restored(store, 3) == contents(state)
    finally:
        away.close()


@pytest.mark.usefixtures("unpacked")
def test_a_group_replaced_or_taken_again_after_its_part_came_is_written_whole(state, tmp_path, monkeypatch):
    """The bytes a part brought say what the group holds only until it is replaced again: a group
    taken away again and one imported over from plain bytes are read out of the store whole (or
    are gone), and the restore is exact."""
    fill(state)
    groups = sorted(state.groups())[:4]
    copy = other(state, tmp_path)
    try:
        moved(state, copy, groups, tmp_path)
        take_groups(copy, frozenset(groups[:1]))                      # taken away again
        copy.import_groups(copy.export_groups(groups[1:2]))           # replaced by plain bytes
        reads = FullReads(monkeypatch, copy)
        store, files = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY), CheckpointFiles()
        out = checkpoint(files, store, copy, 1)
        assert reads.groups == [groups[1]]
        assert sorted(full_files(out, 1)) == groups[1:]
        assert restored(store, 1) == contents(copy)
    finally:
        copy.close()


@pytest.mark.usefixtures("unpacked")
def test_a_group_whose_keys_since_its_part_outgrow_it_is_written_whole(state, tmp_path, monkeypatch):
    """More keys written since the import than the group's bytes hold (past ``outgrown_at``): its
    delta would outgrow the full file, so the group is read whole, as a chain past its bound is."""
    fill(state)
    group = sorted(state.groups())[0]
    copy = other(state, tmp_path)
    try:
        received = moved(state, copy, [group], tmp_path)
        extra = [k for k in (f"new-{i}" for i in range(1_000_000)) if key_group(k) == group]
        assert len(extra) > 3 * received[group].keys
        for k in extra[:3 * received[group].keys]:
            copy.put(k, 1)
        reads = FullReads(monkeypatch, copy)
        store, files = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY), CheckpointFiles()
        checkpoint(files, store, copy, 1)
        assert reads.groups == [group]
        assert restored(store, 1) == contents(copy)
    finally:
        copy.close()


@pytest.mark.usefixtures("unpacked")
def test_an_aborted_first_checkpoint_after_the_move_is_built_on_and_restores_exactly(state, tmp_path, monkeypatch):
    """The copy's first checkpoint cut short after 10 of its groups: the next one references those
    files (the bytes the parts brought) and writes the rest from theirs; nothing read whole."""
    fill(state)
    groups = sorted(state.groups())[:32]
    copy = other(state, tmp_path)
    try:
        moved(state, copy, groups, tmp_path)
        store, files = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY), CheckpointFiles()
        aborted_after(files, 1, 10, monkeypatch)
        first = checkpoint(files, store, copy, 1, complete=False)
        assert "aborted" in first["error"]
        for i in range(0, K, 60):
            if key_group(f"car-{i:07d}") in groups:
                copy.put(f"car-{i:07d}", [i, 6.0])
        reads = FullReads(monkeypatch, copy)
        second = checkpoint(files, store, copy, 2)
        assert reads.groups == []
        assert len(full_files(second, 1)) == 10 and len(full_files(second, 2)) == len(groups) - 10
        assert restored(store, 2) == contents(copy)
    finally:
        copy.close()


def test_a_small_group_a_part_brought_is_written_whole_into_the_pes_state_file(state, tmp_path, monkeypatch):
    """A group whose bytes are at most ``PACK_DELTA`` (10^3-10^4 keys in all) goes into its PE's
    ``.state`` as any small full file does (one slot a group there: its bytes and a delta could
    not both be), read whole as before; the restore is exact."""
    from pescheduler.state.incremental import PACK_DELTA

    fill(state, 300)
    groups = sorted(state.groups())[:8]
    copy = other(state, tmp_path)
    try:
        received = moved(state, copy, groups, tmp_path)
        assert all(len(r.data) <= PACK_DELTA for r in received.values())
        reads = FullReads(monkeypatch, copy)
        store, files = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY), CheckpointFiles()
        out = checkpoint(files, store, copy, 1)
        assert sorted(reads.groups) == sorted(received) and full_files(out, 1) == {}
        assert restored(store, 1) == contents(copy)
    finally:
        copy.close()


def lazily_restored(store: CheckpointStore, checkpoint_id: int, into, tmp_path) -> None:
    """``into`` made checkpoint ``checkpoint_id``'s state as a lazy restore makes it: each key
    group read from its chain's files and made ready in the worker's thread (``resolve_part``
    with the backend's ``prepare_group``), then imported."""
    from pescheduler.state.incremental import load_snapshot, load_state_file, resolve_part, with_entries
    from pescheduler.state.groups import restore_groups

    manifest = store.manifest(checkpoint_id)
    entry = next(e for e in manifest["files"] if e["role"] == "state")
    blob = load_state_file(store.read(entry, store.run))
    groups = with_entries(blob["groups"], manifest["files"], lambda e: store.read(e, store.run))
    saved = load_snapshot(blob["ops"], groups)["op"]["state"]
    part = resolve_part(saved, store.storage, None, preparer(into, tmp_path))
    restore_groups(into, part["groups"])


def pe_checkpoint(files, store, state, checkpoint_id: int, pe: str) -> dict:
    """:func:`checkpoint` of a PE named ``pe``."""
    from pescheduler.state.groups import snapshot_groups
    from pescheduler.state.incremental import pickle_snapshot

    blob, views = pickle_snapshot({"op": {"state": {"groups": snapshot_groups(state)}, "progress": None,
                                          "driver": None}})
    files.hold("d", checkpoint_id, pe, {"state": blob, "views": views, "positions": {}})
    out = files.write("d", checkpoint_id, [pe], store.url)[pe]
    store.commit_manifest(checkpoint_id, {"id": checkpoint_id, "files": out["files"]})
    files.end("d", checkpoint_id, complete=True)
    return out


@pytest.mark.usefixtures("unpacked")
def test_a_lazily_restored_state_grows_the_chains_it_was_read_from(state, tmp_path, monkeypatch):
    """A PE restored after its worker died (a new worker: a writer that never saw its chains) whose
    groups a lazy restore read from checkpoint 2's files: its next checkpoint references those
    files and writes a delta for the keys changed since, no group read whole (but those whose
    turn it is); the restore of it is exact."""
    fill(state)
    store = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY)
    old = CheckpointFiles()
    checkpoint(old, store, state, 1)
    for i in range(0, K, 100):
        state.put(f"car-{i:07d}", [i, 2.0])
    checkpoint(old, store, state, 2)
    again = other(state, tmp_path)
    try:
        lazily_restored(store, 2, again, tmp_path)
        for i in range(1, K, 100):
            again.put(f"car-{i:07d}", [i, 3.0])
        reads = FullReads(monkeypatch, again)
        third = checkpoint(CheckpointFiles(), store, again, 3)
        turns = {g for g in again.groups() if rewrite_turn(g, 3, dask.config.get("pescheduler.checkpoint.max-deltas"))}
        assert set(reads.groups) <= turns, f"groups read whole out of the store: {sorted(set(reads.groups) - turns)}"
        assert set(full_files(third, 3)) <= turns
        assert sum(1 for f in third["files"] if f["chk"] == 1 and f["path"].endswith(".full")) >= 128 - len(turns)
        assert restored(store, 3) == contents(again) == {**contents(state), **{f"car-{i:07d}": [i, 3.0] for i in range(1, K, 100)}}
    finally:
        again.close()


@pytest.mark.usefixtures("unpacked")
def test_a_state_restored_under_another_pes_name_grows_that_pes_chains(state, tmp_path, monkeypatch):
    """Recovery on fewer workers fuses the PEs anew: the restored state is a view of another name.
    Its checkpoints reference the old PE's files under that PE's name (``"view"`` in the chain)
    and grow them by deltas of their own; the restores of two checkpoints after are exact."""
    fill(state, 5_000)
    store = CheckpointStore(f"memory://moved-{uuid.uuid4().hex}", KEY)
    checkpoint(CheckpointFiles(), store, state, 1)
    again = other(state, tmp_path)
    try:
        lazily_restored(store, 1, again, tmp_path)
        for i in range(0, 5_000, 50):
            again.put(f"car-{i:07d}", [i, 7.0])
        reads, files = FullReads(monkeypatch, again), CheckpointFiles()
        out = pe_checkpoint(files, store, again, 2, "elsewhere")
        turns = {g for g in again.groups() if rewrite_turn(g, 2, dask.config.get("pescheduler.checkpoint.max-deltas"))}
        assert set(reads.groups) <= turns, f"groups read whole out of the store: {sorted(set(reads.groups) - turns)}"
        old = [f["path"] for f in out["files"] if f["path"].startswith("chk-000001/pe.0.g")]
        assert len(old) >= len(again.groups()) - len(turns) and all("view" not in f for f in out["files"])
        assert restored(store, 2) == contents(again)
        for i in range(1, 5_000, 50):
            again.put(f"car-{i:07d}", [i, 8.0])
        pe_checkpoint(files, store, again, 3, "elsewhere")
        assert restored(store, 3) == contents(again)
    finally:
        again.close()


@pytest.mark.usefixtures("unpacked")
def test_a_state_restored_from_another_runs_files_writes_its_groups_whole(state, tmp_path, monkeypatch):
    """A run started from another run's checkpoint: the restored files stay that run's, so the new
    run's first checkpoint writes its groups whole, as before; exact."""
    fill(state, 5_000)
    url = f"memory://moved-{uuid.uuid4().hex}"
    first = CheckpointStore(url, KEY)
    checkpoint(CheckpointFiles(), first, state, 1)
    again = other(state, tmp_path)
    try:
        lazily_restored(first, 1, again, tmp_path)
        second = CheckpointStore(url, KEY)
        assert second.run != first.run
        reads = FullReads(monkeypatch, again)
        out = checkpoint(CheckpointFiles(), second, again, 2)
        assert sorted(reads.groups) == sorted(again.groups()) and len(full_files(out, 2)) == len(again.groups())
        assert restored(second, 2) == contents(again) == contents(state)
    finally:
        again.close()
