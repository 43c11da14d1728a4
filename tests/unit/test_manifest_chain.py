"""A checkpoint's manifest holds what changed since its predecessor's (checkpoint/storage.py): its
bytes are counted and small beside the state, a restore walks the chain back to every file exactly,
retention keeps the manifests a kept checkpoint walks (and only as many as the walk reads), and a
damaged manifest in the chain falls back to a checkpoint that does not walk it, pruning saying so.

The worker's side (ChainWriter through CheckpointFiles) writes into a real storage; the deploying
process's side (manifest, prune, restore) is the real CheckpointStore and load_states. Bytes are
counted, nothing is timed. Both backends.
"""

from __future__ import annotations

import logging
import os
import uuid

import dask.config
import pytest
from keyed_stores import state, unpacked, worker_dir  # noqa: F401  (fixtures)
from test_incremental_checkpoint import KEY, checkpoint, restored
from test_incremental_small import take

from pescheduler.checkpoint import CheckpointStore
from pescheduler.checkpoint.storage import MANIFEST, TURNS


def listed(files: list[dict]) -> set:
    return {(f["path"], f["bytes"], f["sha256"], f["role"], f.get("run")) for f in files}


def churn(st, rows: dict, cid: int) -> None:
    """1 % of the keys changed (others each time), as bench/state.py's table."""
    for i in range(cid % 100, len(rows), 100):
        rows[i] = [i, cid]
        st.put(i, rows[i])


@pytest.mark.usefixtures("unpacked")
@pytest.mark.parametrize("k", [1_000, 10_000])
def test_a_manifest_is_what_changed_since_the_previous_one_and_resolves_to_every_file(state, k):
    """Over more than a cycle of turns, 1 % of the keys changed before each checkpoint: every
    manifest lists (walked back) exactly the files its checkpoint references, the largest of
    them is small beside the state (a whole list grew to 4.5 times the state at 10^3 keys here,
    2.4 times at 10^4), and the newest restores exactly."""
    store, files = CheckpointStore(f"memory://chain-{uuid.uuid4().hex}", KEY), None
    from pescheduler.worker.ckpt_files import CheckpointFiles

    files = CheckpointFiles()
    rows = {i: [i, 0] for i in range(k)}
    for i, row in rows.items():
        state.put(i, row)
    checkpoint(files, store, state, 1)
    shares = []
    for cid in range(2, TURNS + 8):
        churn(state, rows, cid)
        out = checkpoint(files, store, state, cid)
        assert listed(store.manifest(cid)["files"]) == listed(out["files"]), f"checkpoint {cid}"
        size = store.fs.size(f"{store._dir(cid)}/{MANIFEST}")
        shares.append(round(size / sum(f["bytes"] for f in out["files"] if f["role"] in ("group", "state")), 4))
    bound = {1_000: 0.2, 10_000: 0.1}[k]
    assert max(shares) <= bound, f"{k} keys: the largest manifest was {max(shares):.1%} of the state ({shares})"
    assert restored(store, TURNS + 7) == rows


def test_retention_keeps_the_manifests_a_kept_checkpoint_walks_and_no_more(state, tmp_path):
    """One checkpoint kept (pruned after each): the manifests the newest is written against stay
    (as LINK.json: not complete, never restored), every file a restore reaches is there and the
    restore is exact; a checkpoint directory goes once no kept manifest walks it (at most TURNS
    back) nor references its files."""
    store = CheckpointStore(str(tmp_path / "ckpt"), KEY)
    from pescheduler.worker.ckpt_files import CheckpointFiles

    files, rows = CheckpointFiles(), {i: [i, 0] for i in range(2_000)}
    for i, row in rows.items():
        state.put(i, row)
    run = os.path.join(store.root, store.run)
    for cid in range(1, TURNS + 12):
        churn(state, rows, cid)
        checkpoint(files, store, state, cid)
        store.prune(1)
        assert store.prune_error is None and store.completed() == [cid]
        manifest = store.manifest(cid)
        for i in manifest["walked"][1:]:
            assert os.listdir(os.path.join(run, f"chk-{i:06d}")).count("LINK.json") == 1, (cid, i)
        for f in (f for f in manifest["files"] if "data" not in f):     # a small delta is in the manifest
            assert os.path.exists(os.path.join(run, f["path"])), (cid, f["path"])
        needed = {f"chk-{i:06d}" for i in manifest["walked"]} | {f["path"].split("/")[0] for f in manifest["files"]
                                                                 if "data" not in f}
        assert set(os.listdir(run)) == needed, f"checkpoint {cid}"
        if cid % 16 == 0:
            assert restored(store, cid) == rows
    assert len(manifest["walked"]) == TURNS
    assert restored(store, TURNS + 11) == rows


def test_a_damaged_manifest_in_the_chain_falls_back_and_pruning_says_so(state, tmp_path, caplog):
    """Checkpoint 5's manifest is damaged: 6 to 8 are written against it, so their restore refuses
    it (naming it) and 4 is restored exactly; pruning says which and removes nothing, and the next
    manifest lists every file, so checkpoint 9 restores again."""
    from test_checkpoint import placement

    from pescheduler.checkpoint.restore import load_states
    from pescheduler.state import open_state
    from pescheduler.state.groups import restore_groups
    from pescheduler.state.incremental import resolve_restore
    from pescheduler.worker.ckpt_files import CheckpointFiles

    pl = placement()
    op = next(o for o in pl.plan.ops if o.startswith("running_sum"))
    store, files, rows = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles(), {}
    for i in range(2_000):
        rows[f"car-{i:07d}"] = [i, 0.0]
        state.put(f"car-{i:07d}", rows[f"car-{i:07d}"])
    kept = {}
    for cid in range(1, 9):
        state.put("car-0000042", [42, float(cid)])
        take(files, store, state, pl, op, cid)
        kept[cid] = dict(rows, **{"car-0000042": [42, float(cid)]})
    damaged = os.path.join(store.root, store.run, "chk-000005", MANIFEST)
    with open(damaged, "r+b") as f:
        f.seek(30)
        f.write(b"X")
    with caplog.at_level(logging.WARNING):
        states = load_states(store, 8, pl)
    assert states[op]["checkpoint"] == 4
    assert "checkpoint 8's manifest builds on checkpoint 5's, which is damaged" in caplog.text
    assert restored_state(states, op, resolve_restore, restore_groups, open_state) == kept[4]
    before = sorted(os.listdir(os.path.join(store.root, store.run)))
    assert store.prune(3) == [] and "damaged" in store.prune_error and "checkpoint 5" in store.prune_error
    assert sorted(os.listdir(os.path.join(store.root, store.run))) == before
    state.put("car-0000042", [42, 9.0])
    take(files, store, state, pl, op, 9)
    assert "base" not in __import__("json").loads(store.fs.cat_file(f"{store._dir(9)}/{MANIFEST}"))
    states = load_states(store, 9, pl)
    assert states[op]["checkpoint"] == 9
    assert restored_state(states, op, resolve_restore, restore_groups, open_state) == dict(rows, **{"car-0000042": [42, 9.0]})


def restored_state(states, op, resolve_restore, restore_groups, open_state) -> dict:
    resolve_restore(states)
    target = open_state("memory")
    restore_groups(target, states[op]["state"]["groups"])
    return {k: target.get(k) for g in target.groups() for k, _ in target.items(g)}


@pytest.mark.usefixtures("unpacked")
def test_a_small_max_deltas_still_restores_through_the_walk(state):
    """max-deltas 4, a key deleted each time: chains rewritten often, files dropped at most
    checkpoints; the walk's drops and listings resolve to exactly the referenced files at every
    checkpoint, and no manifest after the first holds half its whole list (a quarter of the
    groups is rewritten at each checkpoint here: up to 31 % of it)."""
    from pescheduler.worker.ckpt_files import CheckpointFiles

    store, files, sizes = CheckpointStore(f"memory://small-{uuid.uuid4().hex}", KEY), CheckpointFiles(), []
    with dask.config.set({"pescheduler.checkpoint.max-deltas": 4}):
        rows = {i: [i, 0] for i in range(1_000)}
        for i, row in rows.items():
            state.put(i, row)
        for cid in range(1, TURNS + 4):
            churn(state, rows, cid)
            state.delete(cid)
            rows.pop(cid)
            out = checkpoint(files, store, state, cid)
            assert listed(store.manifest(cid)["files"]) == listed(out["files"]), f"checkpoint {cid}"
            sizes.append(store.fs.size(f"{store._dir(cid)}/{MANIFEST}"))
    assert max(sizes[1:]) <= sizes[0] / 2, sizes
    assert restored(store, TURNS + 3) == rows
