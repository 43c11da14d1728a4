"""A PE restored from a checkpoint starts at once; its key groups load on first touch and in the
background (pescheduler/worker/lazy_restore.py, issue 30: first output after a SIGKILL bounded).

A real PE host on loopback deploys a PE whose ``latest`` (KEYED, its rows in the deployment's
backend) is restored from a real incremental checkpoint: its key groups are references to
files, read by the worker. ``latest`` emits each update with the key's ``previous`` row, so a
tuple that saw empty state instead of its restored group shows as ``previous: None``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import os
import shutil
import threading
import time
import uuid
from types import SimpleNamespace

import cloudpickle
import dask.config
import pytest
from tests.waiting import until_async
from growth import assert_grows_less
from support_ops import Collect

from pescheduler import MIN_WATERMARK
from pescheduler.checkpoint import CheckpointStore
from pescheduler.checkpoint.restore import saved_states
from pescheduler.state import incremental, key_group, open_state
from pescheduler.state.groups import key_groups, snapshot_groups
from pescheduler.state.files import StateFiles
from pescheduler.state.local import LOCAL, LocalCopies
from pescheduler.state.settings import deployment_dir
from pescheduler.state.incremental import pickle_snapshot
from pescheduler.worker import handshake
from pescheduler.worker.barriers import barrier
from pescheduler.worker.channels import DATA, MARKER
from pescheduler.worker.ckpt_files import CheckpointFiles
from pescheduler.worker.pehost import PEHost
from pescheduler.wire import InputSpec, PESpec

from operators.latest import Latest

DEP = "dep-lazy"
IN = f"{DEP}/0/src.out->pe"
BOUND = 20.0                       # seconds: every wait here is bounded by this (a loaded machine)
KEY = b"k" * 32


def _key(i: int) -> str:
    return f"car-{i:07d}"


def _row(i: int) -> dict:
    """A restored row: about the bench's 180 bytes of Python per key (bench/state.py part 6)."""
    return {"id": _key(i), "v": i, "slots": [i, float(i), -i, 1.5]}


def _checkpointed(k: int, ids: list[int] | None = None) -> dict:
    """``latest``'s restore entry from a real checkpoint of ``k`` rows (or of the rows ``ids``): key
    groups as file references."""
    rows = open_state("memory")
    rows.write_many((_key(i), _row(i)) for i in (range(k) if ids is None else ids))
    store, files = CheckpointStore(f"memory://lazy-{uuid.uuid4().hex}", KEY), CheckpointFiles()
    blob, views = pickle_snapshot({"state": {"state": {"groups": snapshot_groups(rows)}, "progress": None,
                                             "driver": None}})
    files.hold(DEP, 1, "pe", {"state": blob, "views": views, "positions": {}})
    written = files.write(DEP, 1, ["pe"], store.url)["pe"]["files"]
    store.commit_manifest(1, {"id": 1, "files": written})
    files.end(DEP, 1, complete=True)
    return _restored(store, 1)


def _restored(store: CheckpointStore, checkpoint_id: int) -> dict:
    """``latest``'s restore entry from checkpoint ``checkpoint_id`` of ``store``, every file it
    lists checked as a recovery checks them (``checkpoint/restore.saved_states``)."""
    saved = saved_states(store, store.verify(checkpoint_id))[0]["state"]
    saved["progress"] = ({"src": MIN_WATERMARK}, MIN_WATERMARK, ["src"], False)
    return {**saved, "checkpoint": checkpoint_id, "storage": store.storage}


def _spec(restore: dict) -> PESpec:
    return PESpec("pe", DEP, {"state": (Latest, {"key": "id"}, "id"), "sink": (Collect, {}, None)},
                  [("src", "out", "state"), ("state", "out", "sink")], inputs=[InputSpec(IN, "src", "out")],
                  restore={"state": restore})


def _update(i: int, v: int) -> dict:
    return {"op": "update", "id": _key(i), "after": {"id": _key(i), "v": v}}


async def _host(backend: str) -> PEHost:
    host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:lazy", handlers={}, ip="127.0.0.1"))
    await host.start()
    host.pe_secret(DEP, handshake.new_secret(), state=backend)
    return host


def _until(predicate, what: str):
    """Yield to the loop until ``predicate()``, bounded by BOUND: the PEs run on this very loop."""
    return until_async(predicate, BOUND, what)


@pytest.fixture(autouse=True)
def worker_dir(tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "worker"), "pescheduler.state.cache": "8MB"}):
        yield


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_tuple_of_a_group_not_loaded_yet_waits_for_its_group_and_sees_its_restored_state(backend):
    """Every restored key is updated once, all of them before any group is loaded: none sees
    empty state (``previous`` is its restored row), and the group a tuple waits for loads first."""
    k = 2000
    restore = _checkpointed(k)

    async def scenario():
        host = await _host(backend)
        loads: list[int] = []
        try:
            spec = _spec(restore)
            await host.pe_deploy(cloudpickle.dumps([spec]), start=False)
            loader = host.loaders[(DEP, "pe")]
            read = loader.pending["state"].read
            loader.pending["state"].read = lambda g, local: (loads.append(g), read(g, local))[1]
            pe = host.pes[(DEP, "pe")]
            loader.start = lambda: asyncio.create_task(asyncio.sleep(0))    # this test drives the loads
            await host._start(DEP, ["pe"], SimpleNamespace(lap=lambda _name: None))
            gate = pe.rewirer.pending["state"]
            assert len(gate.waiting) == len({key_group(_key(i)) for i in range(k)})
            touched = max(range(k), key=lambda i: key_group(_key(i)))        # its group is the last in order
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(touched, -1)])
            sunk = pe.ops["sink"].items
            await _until(lambda: gate.buffered or sunk or pe.state != "running", "the tuple is taken")
            assert pe.state == "running", pe.error
            assert sunk == [] and gate.buffered == 1, f"a tuple went through before its group was loaded: {sunk}"
            assert await loader.load_one()
            assert loads == [key_group(_key(touched))], "the group a tuple waits for is loaded first"
            await _until(lambda: len(sunk) == 1, "its tuple goes through once its group is in")
            assert sunk[0]["previous"] == _row(touched)
            others = [i for i in range(k) if i != touched]
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(i, -1) for i in others])
            await _until(lambda: gate.buffered + len(sunk) - 1 >= len(others), "every tuple taken")
            while await loader.load_one():
                pass
            await _until(lambda: len(sunk) == k, "every tuple out")
            assert gate.done and len(loads) == len(set(loads))
            assert {t["id"]: t["previous"] for t in sunk} == {_key(i): _row(i) for i in range(k)}
            assert [t["id"] for t in sunk if key_group(t["id"]) == key_group(_key(others[0]))] == \
                [_key(i) for i in others if key_group(_key(i)) == key_group(_key(others[0]))]   # arrival order
        finally:
            await host.close()
    asyncio.run(scenario())


async def _loading(host: PEHost, restore: dict):
    """The restored PE started, its loader driven by the test (nothing loaded yet); the deploy's
    answer."""
    answer = await host.pe_deploy(cloudpickle.dumps([_spec(restore)]), start=False)
    loader = host.loaders.get((DEP, "pe"))
    assert loader is not None, f"restored at once, not lazily: {answer}"
    loader.start = lambda: asyncio.create_task(asyncio.sleep(0))
    await host._start(DEP, ["pe"], SimpleNamespace(lap=lambda _name: None))
    return host.pes[(DEP, "pe")], loader, answer


async def _checkpoint(host: PEHost, pe, store: CheckpointStore, checkpoint_id: int) -> dict:
    """Checkpoint ``checkpoint_id`` through the worker's path: its barrier on the PE's input, the
    snapshot held, the files written into ``store``'s run, the manifest, the end; the manifest."""
    pe.ports.inbox.put(pe.ports.receivers[IN], MARKER, barrier(checkpoint_id, pe.spec.epoch))
    answer = await host.pe_ckpt_wait(DEP, checkpoint_id, ["pe"], BOUND)
    assert not answer["missing"] and "error" not in answer["results"]["pe"], answer
    written = await host.pe_ckpt_write(DEP, checkpoint_id, ["pe"], store.url)
    assert "error" not in written["pe"], written
    files = written["pe"]["files"]
    store.commit_manifest(checkpoint_id, {"id": checkpoint_id, "files": files})
    await host.pe_ckpt_end(DEP, checkpoint_id, complete=True)
    return store.manifest(checkpoint_id)


@pytest.mark.parametrize("backend", ["memory", "disk"])
@pytest.mark.parametrize("where", ["same run", "new run"])
def test_a_checkpoint_while_restored_groups_load_completes_and_restores_every_key(backend, where):
    """A checkpoint taken after some groups loaded (and some keys of them updated) references the
    restored checkpoint's files for the others; retention keeps those files; a restore from it,
    and from the next checkpoint (after the load, its key-group maps extending this one's), gives
    every key: the updated ones as updated, the others as first restored. ``new run``: the
    checkpoint is written by a run started from the first one's (its files stay in that run)."""
    k = 1500
    restore = _checkpointed(k)
    ref = next(iter(restore["state"]["groups"].values()))[1]
    first = CheckpointStore(restore["storage"], KEY, run=ref.run)
    store = first if where == "same run" else CheckpointStore(restore["storage"], KEY)
    by_group: dict[int, list[int]] = {}
    for i in range(k):
        by_group.setdefault(key_group(_key(i)), []).append(i)

    async def taken() -> dict:
        host = await _host(backend)
        try:
            pe, loader, deployed = await _loading(host, restore)
            for _ in range(3):
                assert await loader.load_one()
            loaded = [g for g in by_group if g not in loader.gates["state"].waiting]
            updated = [by_group[g][0] for g in loaded]
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(i, -7) for i in updated])
            sunk = pe.ops["sink"].items
            await _until(lambda: len(sunk) == len(updated), "the loaded groups' updates out")
            manifest = await _checkpoint(host, pe, store, 2)
            assert pe.stats()["restoring"]["loaded"] == 3, "its figures say how far the load is"
            copies, left = LocalCopies(deployment_dir(DEP)), [e for e in manifest["files"] if e["chk"] == 1]
            assert left and all(copies.read(ref.run, e) is not None for e in left), \
                "this worker's copies of the files the loader still reads are kept"
            assert deployed["loading"] == ["pe"], "the deploy names the PEs restored lazily (the controller)"
            assert not loader.gates["state"].done, "the checkpoint was taken while groups load"
            while await loader.load_one():
                pass
            await _checkpoint(host, pe, store, 3)    # its key-group maps extend checkpoint 2's
            return {"manifest": manifest, "updated": updated}
        finally:
            await host.close()
    got = asyncio.run(taken())
    referenced = [e for e in got["manifest"]["files"] if e["role"] == "group" and e["chk"] == 1]
    assert referenced and all(("run" in e) == (where == "new run") for e in referenced), referenced
    if where == "same run":
        store.prune(retain=2)           # checkpoint 1 goes, but the files 2 references
        assert store.completed() == [2, 3] and 1 in store.ids()

    async def restored(checkpoint_id: int) -> list[dict]:
        host = await _host(backend)
        try:
            await host.pe_deploy(cloudpickle.dumps([_spec(_restored(store, checkpoint_id))]), start=True)
            pe = host.pes[(DEP, "pe")]
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(i, -1) for i in range(k)])
            sunk = pe.ops["sink"].items
            await _until(lambda: len(sunk) == k or pe.state != "running", "every key out")
            assert pe.state == "running", pe.error
            return list(sunk)
        finally:
            await host.close()
    updated = set(got["updated"])
    for checkpoint_id in (2, 3):        # the one taken during the load, and the next, after it
        sunk = asyncio.run(restored(checkpoint_id))
        assert {t["id"]: t["previous"] for t in sunk} == \
            {_key(i): {"id": _key(i), "v": -7} if i in updated else _row(i) for i in range(k)}, checkpoint_id


def test_a_snapshot_while_restored_groups_load_is_refused_not_taken_without_them():
    """A rescale's snapshot before every group is in would move the state without them."""
    restore = _checkpointed(500)

    async def scenario():
        host = await _host("memory")
        try:
            pe, loader, _ = await _loading(host, restore)
            with pytest.raises(RuntimeError, match="still loading the key groups of its restore"):
                await pe.aligned_snapshot()
            while await loader.load_one():
                pass
            snap = await pe.aligned_snapshot()
            assert len(dict(snap["state"]["state"]["groups"])) == loader.gates["state"].total
        finally:
            await host.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_restored_pes_first_output_does_not_wait_for_every_key_group(backend, monkeypatch):
    """The deploy of a restored PE reads no key group, and its first tuple waits for its own group
    only: that group is the one read before its output. From the deploy call to that output the
    process's CPU time at 10x the keys is under 3x (before, the deploy read, checked and unpickled
    all 128 groups first: about 10x). The floor of 20 ms is the deploy's own fixed work at 10^4 keys.

    Counted and on CPU time, so a loaded machine does not decide it: on the wall clock, with the
    loader reading other groups in the background meanwhile, session 75's loaded suite measured
    x3.5 (the loader's thread and other processes taking turns), and which group the loader was
    reading when the tuple came hung on the scheduling. Here the tuple waits at the gate before the
    loader takes its first group (:meth:`Loader.load_one`, the step its task repeats)."""
    reads: list[int] = []
    read_group = incremental.read_group

    def counted(files, ref, *args):
        reads.append(ref.group)
        return read_group(files, ref, *args)
    monkeypatch.setattr(incremental, "read_group", counted)

    def measure(k: int) -> list[float]:
        restore, touched = _checkpointed(k), k // 2

        async def once() -> float:
            host = await _host(backend)
            try:
                reads.clear()
                t0 = time.process_time()
                pe, loader, _answer = await _loading(host, dict(restore, state=restore["state"]))
                assert reads == [], f"the deploy read {len(reads)} key groups"
                pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(touched, -1)])
                gate = pe.rewirer.pending["state"]
                await _until(lambda: gate.buffered or pe.state != "running", "the tuple waits at its group's gate")
                assert await loader.load_one()
                took = (time.process_time() - t0) * 1000
                out = pe.ops["sink"].items
                assert out and out[0]["previous"] == _row(touched), "its output came with its group's import"
                assert reads == [key_group(_key(touched))], f"groups read before its output: {reads}"
                return took
            finally:
                await host.close()
        return [asyncio.run(once()) for _ in range(5)]
    assert_grows_less(measure, f"{backend}: deploy of a restored PE to its first output (CPU)", keys=10_000,
                      floor_ms=20.0)


def test_a_group_file_damaged_after_the_deploying_process_checked_it_fails_the_restored_pe():
    """The worker still checks each file before unpickling it: a damaged one, found once the PE
    runs, fails the PE (its recovery restores again) instead of leaving the group empty."""
    restore = _checkpointed(500)
    ref = next(iter(restore["state"]["groups"].values()))[1]
    files = StateFiles(restore["storage"])
    files.fs.pipe_file(f"{files.root}/{ref.run}/{ref.files[0]['path']}", b"not the group")
    shutil.rmtree(os.path.join(deployment_dir(DEP), LOCAL))     # a new worker: no copy of its own

    async def scenario():
        host = await _host("memory")
        try:
            await host.pe_deploy(cloudpickle.dumps([_spec(restore)]), start=True)
            pe = host.pes[(DEP, "pe")]
            await _until(lambda: pe.state != "running", "the PE fails")
            assert pe.state == "failed" and "CheckpointDamaged" in pe.error, pe.error
            assert not pe.ops["sink"].items
        finally:
            await host.close()
    asyncio.run(scenario())


def test_a_rescale_of_a_pe_whose_restored_groups_load_is_refused_before_its_pause_with_the_progress():
    """The reconfigurer refuses a Replicate of a restored window while its PE's worker reports
    groups still loading (asked at the action, not a monitor round old): the record and the
    deployment's events say why and how far the load is; nothing of the protocol runs (before,
    the worker's ``StillLoading`` came half-way through and the reconfiguration failed the
    deployment). Once the worker reports every group in, it is planned."""
    from keyed_handover import WORKERS, placed_keyed_window

    from pescheduler.actions import Replicate
    from pescheduler.control.reconfigurer import Reconfigurer
    from pescheduler.control.state import DeploymentState

    placement, window = placed_keyed_window()
    pe_id = placement.pe_of(window)
    calls: list[str] = []

    class Gateway:
        deployment = "d"
        figures: dict = {}          # the window's PE's figures, as its worker reports them

        async def launch(self, specs, placement):
            calls.append("launch")
            return [pe_id]          # the worker restores it lazily (pe_deploy's "loading")

        async def warm(self, per_worker):
            pass

        async def stats(self, workers, dead_letters=True, acked=None):
            return [{"pes": {pe_id: self.figures}}] if placement.pes[pe_id].worker in workers else []

        def __getattr__(self, name):        # any call of the protocol's (a snapshot, a deploy)
            calls.append(name)
            raise AssertionError(f"the refused rescale called {name}")

    async def scenario():
        state, gateway = DeploymentState(), Gateway()
        rec = Reconfigurer(gateway, state, "d", None, 2)
        rec.worker_info = {w: {"data_address": f"tcp://{w}:1", "host": w} for w in WORKERS}

        async def failed(reason: str) -> None:
            calls.append(f"failure: {reason}")
        rec.on_failure = failed
        state.running(placement.pes)
        await rec.launch(placement, {window: {"state": {}, "progress": None, "storage": "memory://x"}})
        assert rec.restoring_view() == {pe_id: {}}         # the status: restoring, not reported yet
        action = Replicate(window, 1)
        gateway.figures = {"state": "running", "restoring": {"groups": 50, "loaded": 20, "s": 1.5}}
        record = await rec.apply(action, timeout=1.0)
        assert rec.restoring_view() == {pe_id: {"groups": 50, "loaded": 20, "s": 1.5}}
        assert calls == ["launch"], calls
        assert not record.applied and "still loading the key groups of its restore" in record.reason, record.reason
        assert "20 of 50 loaded after 1.5 s" in record.reason, record.reason
        gateway.figures = {"state": "running"}
        await rec._planned(action)          # every group in: it is planned (and would run)
        assert rec.restoring_view() == {}
        return state
    state = asyncio.run(scenario())
    assert calls == ["launch"], calls
    assert [e["kind"] for e in state.events if e["kind"] in ("refused", "restored")] == ["refused", "restored"]


@functools.cache
def _in_group(group: int, n: int) -> list[int]:
    """The first ``n`` row ids whose key is in key group ``group``."""
    found: list[int] = []
    for start in itertools.count(0, 100_000):
        ids = range(start, start + 100_000)
        found += [i for i, g in zip(ids, key_groups([_key(i) for i in ids])) if g == group]
        if len(found) >= n:
            return found[:n]


def _encodes_in_this_thread(monkeypatch) -> list[int]:
    """Keys the disk backend encodes from now on in this thread (the PE's turns run here: the
    loader imports a group holding the PE's turn lock, on this loop); the others are counted too."""
    from pescheduler.state import disk

    counts = [0, 0]                     # this thread, the others
    here, encode = threading.get_ident(), disk._encode

    def counted(key):
        counts[threading.get_ident() != here] += 1
        return encode(key)
    monkeypatch.setattr(disk, "_encode", counted)
    return counts


def test_a_restored_groups_keys_are_made_ready_in_the_loaders_thread_and_only_installed_in_the_pes_turn(monkeypatch):
    """Groups of ~310 keys (an SST file each on disk): loading them all encodes no key in the
    PE's turn (before, the turn encoded and pickled every key of the group: 214-459 ms for a group
    of 78,000 keys at 10^7); the loader's thread encoded each once. Then every key reads its
    restored row, through the store's own get (the bitmap of stored keys included)."""
    from pescheduler.state import disk

    monkeypatch.setattr(disk, "INGEST_KEYS", 256, raising=False)     # groups this small as SST files too
    k = 40_000
    restore = _checkpointed(k)
    counts = _encodes_in_this_thread(monkeypatch)

    async def scenario():
        host = await _host("disk")
        try:
            pe, loader, _ = await _loading(host, restore)
            while await loader.load_one():
                pass
            assert loader.gates["state"].done
            in_turn, loaded = counts[0], counts[1]
            probe = sorted({*{key_group(_key(i)): i for i in range(k)}.values(), 0})     # a key per group, and 0
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(i, -1) for i in probe])
            sunk = pe.ops["sink"].items
            await _until(lambda: len(sunk) == len(probe) or pe.state != "running", "the probes out")
            assert pe.state == "running", pe.error
            assert {t["id"]: t["previous"] for t in sunk} == {_key(i): _row(i) for i in probe}
            return in_turn, loaded
        finally:
            await host.close()
    in_turn, loaded = asyncio.run(scenario())
    assert in_turn == 0, f"{in_turn} keys of restored groups encoded in the PE's turn"
    assert loaded == k


def test_a_restored_group_made_ready_in_the_loaders_thread_is_frozen_when_it_is_ready(
        monkeypatch, no_automatic_collection, freezing):
    """A restored group read and made ready for the store in the loader's thread (an SST file, its
    keys' hashes, a container or more per key) lives until the PE's turn installs it: frozen
    there once ready, no collection visits it (as a rescale's part: test_pending_groups.py)."""
    from pescheduler.state import disk

    monkeypatch.setattr(disk, "INGEST_KEYS", 256, raising=False)
    restore = _checkpointed(5_000)

    async def scenario():
        host = await _host("disk")
        try:
            pe, loader, _ = await _loading(host, restore)
            store, visited = pe.ops["state"]._rows, []
            imports = store.import_groups

            def recorded(part):
                tracked = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
                visited.extend(id(o) in tracked for prepared in part.values()
                           for o in (prepared, prepared.pairs))
                imports(part)
            store.import_groups = recorded
            while await loader.load_one():
                pass
            assert loader.gates["state"].done
            return visited
        finally:
            await host.close()
    visited = asyncio.run(scenario())
    assert visited and not any(visited), f"{sum(visited)} of {len(visited)} objects made ready left to the collector"


def test_a_restored_groups_install_in_the_pes_turn_does_not_grow_with_its_keys(monkeypatch):
    """The PE's turn that imports a restored group (disk) at 10x its keys: under 3x the work (an
    SST file ingested, at both sizes here; before, every key encoded and every value pickled
    there: about 10x). The work is the turn's own CPU time (``thread_time``): its wall time also
    holds the file's sync and, on a loaded machine, other processes' turns (the least of three
    wall times at 20,000 keys 15-17 ms against 8-13 at 2,000 beside two busy loops, the CPU time
    4-6 ms at both). The floor of 5 ms is the ingest's own cost, not the group's."""
    from pescheduler.state import disk

    monkeypatch.setattr(disk, "INGEST_KEYS", 1024, raising=False)
    def measure(n: int) -> list[float]:
        restore = _checkpointed(n, _in_group(0, n))

        async def once() -> float:
            host = await _host("disk")
            try:
                pe, loader, _ = await _loading(host, restore)
                op = pe.ops["state"]
                imports, took = op.import_groups, []

                def timed(part):
                    t = time.thread_time()
                    imports(part)
                    took.append((time.thread_time() - t) * 1000)
                op.import_groups = timed
                assert await loader.load_one() and loader.gates["state"].done
                return took[0]
            finally:
                await host.close()
        return [asyncio.run(once()) for _ in range(3)]
    assert_grows_less(measure, "disk: a restored group's import in the PE's turn", keys=2_000, floor_ms=5.0)


def test_the_joins_and_the_time_window_restore_lazily():
    """The gate holds a two-input operator's tuples per input and takes a columnar operator's
    Arrow batch as rows (pending_groups.py), so the joins and the time window, which import groups
    into a running instance, start before their groups are in (session 46; before, only an
    operator whose tuples all came through ``process`` as rows). One without ``import_groups``
    restores at once."""
    from operators.join import Join
    from operators.join_asof import AsofJoin
    from operators.lookup import Lookup
    from operators.window import Window
    from pescheduler.worker.lazy_restore import lazily

    assert lazily(Join) and lazily(AsofJoin) and lazily(Lookup) and lazily(Window)
    from support_ops import RunningSum

    assert not lazily(RunningSum)


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_a_checkpoint_while_a_tuple_waits_for_its_restored_group_is_declined_not_taken_without_it(backend):
    """A tuple taken before a checkpoint's barrier that waits at the gate for its key group (not
    loaded yet) is in neither the operator's state, nor the restored files the snapshot would
    reference, nor the source position after the barrier: that checkpoint is declined, and the
    next one, once the group is in, holds the tuple's update. Before, it was taken, and a restore
    from it lost the tuple (test_recovery's kills: a window's rows short of tuples, loaded)."""
    k = 1500
    restore = _checkpointed(k)
    ref = next(iter(restore["state"]["groups"].values()))[1]
    store = CheckpointStore(restore["storage"], KEY, run=ref.run)

    async def taken() -> None:
        host = await _host(backend)
        try:
            pe, loader, _deployed = await _loading(host, restore)
            gate = loader.gates["state"]
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(0, -7)])
            await _until(lambda: gate.holding == 1, "the update waits for its group")
            pe.ports.inbox.put(pe.ports.receivers[IN], MARKER, barrier(2, pe.spec.epoch))
            answer = await host.pe_ckpt_wait(DEP, 2, ["pe"], BOUND)
            assert "declined" in answer["results"]["pe"].get("error", ""), answer
            await host.pe_ckpt_end(DEP, 2, complete=False)
            while key_group(_key(0)) in gate.waiting:
                assert await loader.load_one()
            await _until(lambda: len(pe.ops["sink"].items) == 1, "the update out")
            await _checkpoint(host, pe, store, 3)            # groups still load: taken, with the update
            assert not gate.done
        finally:
            await host.close()
    asyncio.run(taken())

    async def restored() -> dict:
        host = await _host(backend)
        try:
            await host.pe_deploy(cloudpickle.dumps([_spec(_restored(store, 3))]), start=True)
            pe = host.pes[(DEP, "pe")]
            pe.ports.inbox.put(pe.ports.receivers[IN], DATA, [_update(0, -1)])
            await _until(lambda: len(pe.ops["sink"].items) == 1 or pe.state != "running", "the key out")
            return pe.ops["sink"].items[0]
        finally:
            await host.close()
    assert asyncio.run(restored())["previous"] == {"id": _key(0), "v": -7}
