"""A checkpoint's writer gives way to the PEs' turns (pescheduler/state/foreground.py).

Traced at 10^7 keys (session 57): in the gaps of 20-40 ms between outputs inside checkpoints the
PE's thread waited for the GIL while the writer's thread ran Python beside it. A PE's turn is now
counted while it runs (``worker/turns.py``), and the writer, working in ``background()``, waits
between two slices of its work while a turn runs: at most as long as its own last stretch, so it
never starves. The real writer (``CheckpointFiles`` and ``ChainWriter``, both backends) and the
real ``Turns``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import dask.config
import pytest
from keyed_stores import state, unpacked, worker_dir  # noqa: F401  (fixtures)
from test_incremental_checkpoint import KEY, checkpoint, fill, restored

from pescheduler.checkpoint import CheckpointStore
from pescheduler.state import foreground, incremental
from pescheduler.state.foreground import FOREGROUND, Foreground
from pescheduler.worker import process_settings
from pescheduler.worker.ckpt_files import CheckpointFiles
from pescheduler.worker.turns import Turns

BOUND_S = 30        # every wait on a thread's progress is bounded by this


class Signalling(threading.Condition):
    """A Foreground's condition that tells the test when a writer begins to wait on it."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.waiting = threading.Event()

    def wait_for(self, predicate, timeout=None):
        self.waiting.set()
        return super().wait_for(predicate, timeout)


def worked(fg: Foreground, stretch_s: float) -> None:
    """This background thread as if it had worked ``stretch_s`` since its last ``give_way`` (and
    its last pause): the stretch that bounds its next wait."""
    fg._local.since -= stretch_s
    fg._local.paused -= stretch_s


def in_background(fg: Foreground, stretch_s: float, done: threading.Event, out: dict) -> threading.Thread:
    """A writer's thread: ``stretch_s`` of work, then one ``give_way``; how long that waited in ``out``."""
    def run() -> None:
        with fg.background():
            worked(fg, stretch_s)
            t0 = time.perf_counter()
            fg.give_way()
            out["waited_s"] = time.perf_counter() - t0
        done.set()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_background_work_waits_while_a_turn_runs_and_goes_on_when_it_ends(monkeypatch):
    monkeypatch.setattr(foreground, "MOST_S", 60.0)
    fg, done, out = Foreground(), threading.Event(), {}
    fg._cond = Signalling()
    with fg.turn():
        writer = in_background(fg, 2.0, done, out)       # it may wait up to its 2 s stretch
        assert fg._cond.waiting.wait(BOUND_S), "the writer never waited for the turn"
        assert not done.is_set()
    assert done.wait(BOUND_S), "the turn's end did not wake the writer"
    writer.join(BOUND_S)
    assert out["waited_s"] < 2.0 and fg.waited_s > 0, out


def test_a_wait_lasts_at_most_the_writers_own_last_stretch_so_a_turn_never_ending_starves_nothing(monkeypatch):
    monkeypatch.setattr(foreground, "MOST_S", 60.0)
    fg, done, out = Foreground(), threading.Event(), {}
    with fg.turn():                     # a PE that is never idle
        in_background(fg, 0.2, done, out).join(BOUND_S)
        assert done.is_set()
        assert 0.15 <= out["waited_s"] < 10, out        # about its 0.2 s stretch, not the turn's end
    monkeypatch.setattr(foreground, "MOST_S", 0.05)
    done.clear()
    with fg.turn():
        in_background(fg, 1.0, done, out).join(BOUND_S)
        assert done.is_set() and out["waited_s"] < 0.9, out      # and at most MOST_S


@pytest.mark.parametrize("how", ["outside background", "turned off", "no turn running"])
def test_give_way_waits_only_in_background_work_while_a_turn_runs_and_enabled(how):
    fg = Foreground()
    fg.enabled = how != "turned off"
    turn = fg.turn()
    if how != "no turn running":
        turn.__enter__()
    try:
        if how == "outside background":
            fg.give_way()
        else:
            with fg.background():
                worked(fg, 0.05)
                fg.give_way()
    finally:
        if how != "no turn running":
            turn.__exit__(None, None, None)
    assert fg.waited_s == 0 and fg._waiting == 0
    # a writer that met no turn let its CPU go instead (it had worked 50 ms): nothing else did
    assert fg.pauses == (1 if how == "no turn running" else 0), fg.pauses


class Clock:
    """The time ``foreground`` reads and sleeps on, set by the test: its work and its waits are
    what the test says, whatever a loaded machine does between two calls."""

    def __init__(self) -> None:
        self.now = 1024.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_writer_that_meets_no_turn_lets_its_cpu_go_after_each_pause_every_s_of_work(monkeypatch):
    """Session 58's trace: the worker's event loop waited 74 ms for a CPU (not the GIL) while the
    writer ran on the other core, and nothing counted ran, so the writer never waited."""
    clock = Clock()
    monkeypatch.setattr(foreground, "time", clock)
    monkeypatch.setattr(foreground, "PAUSE_S", 2 ** -11)        # about the real ones, and exact in
    monkeypatch.setattr(foreground, "PAUSE_EVERY_S", 2 ** -8)   # binary: the clock's sums are too
    monkeypatch.setattr(foreground, "MOST_S", BOUND_S)     # a wait for a turn lasts until it ends
    fg = Foreground()
    with fg.background():
        fg.give_way()                   # just began: no pause
        assert fg.pauses == 0
        clock.now += foreground.PAUSE_EVERY_S               # it worked that long
        fg.give_way()
        assert fg.pauses == 1 and fg.paused_s >= foreground.PAUSE_S, (fg.pauses, fg.paused_s)
        fg.give_way()                   # right after its pause: none
        assert fg.pauses == 1
        fg._cond = Signalling()
        ended = threading.Event()
        turn = fg.turn()
        turn.__enter__()

        def end_turn() -> None:         # a turn that ends PAUSE_S after the writer began to wait for it
            assert fg._cond.waiting.wait(BOUND_S)
            clock.now += foreground.PAUSE_S
            turn.__exit__(None, None, None)
            ended.set()
        threading.Thread(target=end_turn).start()
        worked(fg, BOUND_S)             # its next pause due; its wait bounded by that stretch, not 4 ms
        fg.give_way()                   # it slept waiting for the turn: that was its pause
        assert ended.wait(BOUND_S) and fg.waited_s >= foreground.PAUSE_S
        fg.give_way()
        assert fg.pauses == 1, "a wait for a turn it slept through is a pause: no second one"
    assert fg.waited_s < BOUND_S


@pytest.mark.usefixtures("unpacked")
def test_a_checkpoints_writer_gives_way_at_each_key_group_while_a_turn_runs_and_still_finishes(state, tmp_path, monkeypatch):
    """The real writer, a turn held open the whole time (a PE never idle): it waits at each key
    group, each wait bounded by its own stretch, and the checkpoint is whole."""
    calls: list[str] = []
    real = incremental.give_way
    monkeypatch.setattr(incremental, "give_way", lambda: (calls.append(threading.current_thread().name), real()))
    store, files = CheckpointStore(str(tmp_path / "ckpt"), KEY), CheckpointFiles()
    fill(state, 20_000)
    model = {f"car-{i:07d}": [i, 1.0] for i in range(20_000)}
    before, result = FOREGROUND.waited_s, {}
    with FOREGROUND.turn():
        writer = threading.Thread(target=lambda: result.update(out=checkpoint(files, store, state, 1)), name="writer")
        writer.start()
        writer.join(BOUND_S)
        assert not writer.is_alive(), "the writer starved beside a turn that never ended"
    assert calls.count("writer") >= 128, f"the writer gave way {calls.count('writer')} times for 128 key groups"
    assert FOREGROUND.waited_s > before, "the writer never waited for the turn"
    assert restored(store, 1) == model
    calls.clear()
    before, paused = FOREGROUND.waited_s, FOREGROUND.pauses
    fill(state, 20_000, value=lambda i: [i, 2.0])       # every key changed: tens of ms of work
    checkpoint(files, store, state, 2)          # no turn running: no wait, its CPU let go
    assert calls and FOREGROUND.waited_s == before
    assert FOREGROUND.pauses > paused, "the writer never let its CPU go"
    assert restored(store, 2) == {k: [v[0], 2.0] for k, v in model.items()}


@pytest.mark.parametrize("threaded", [False, True])
def test_a_pes_turn_is_counted_while_it_runs_on_the_loop_or_in_its_thread(threaded):
    seen = []

    async def run() -> None:
        turns = Turns("pe", 0.01)
        turns.bind()
        if threaded:
            turns.go_threaded("a test")
        await turns.run(lambda: seen.append(FOREGROUND._running) or True)
        turns.close()
    asyncio.run(run())
    assert seen == [1] and FOREGROUND._running == 0


def test_the_event_loops_work_is_counted_as_a_turn_its_wait_for_events_is_not():
    fg, seen, seen_idle = Foreground(), [], threading.Event()

    def idle() -> None:
        """Wait, as a writer does, until nothing counted runs: the loop in its select."""
        with fg._cond:
            fg._waiting += 1
            seen.append(fg._cond.wait_for(lambda: fg._running == 0, timeout=BOUND_S))
            fg._waiting -= 1
        seen_idle.set()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert fg.count_loop(loop) and not fg.count_loop(loop)      # once
        seen.append(fg._running)                                    # at work: counted
        reader, writer = await asyncio.open_connection(*server)
        waiter = threading.Thread(target=idle)
        waiter.start()                  # the loop waits for the server's reply in its select
        assert await asyncio.wait_for(reader.readline(), BOUND_S) == b"hi\n"
        waiter.join(BOUND_S)
        seen.append(fg._running)
        writer.close()

    import socket
    listener = socket.create_server(("127.0.0.1", 0))
    server = listener.getsockname()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            seen_idle.wait(BOUND_S)                 # the loop was seen idle first
            conn.sendall(b"hi\n")
    threading.Thread(target=serve, daemon=True).start()
    asyncio.run(run())
    listener.close()
    assert seen == [1, True, 1], seen
    assert fg._running == 0             # the loop closed: its count went with it


@pytest.mark.parametrize("on", [True, False])
def test_a_worker_process_gives_way_as_its_settings_say(on):
    before = FOREGROUND.enabled, sys.getswitchinterval()
    try:
        with dask.config.set({"pescheduler.pe.writer-gives-way": on, "pescheduler.pe.gc-freeze": False}):
            process_settings.apply()
        assert FOREGROUND.enabled is on
    finally:
        FOREGROUND.enabled = before[0]
        sys.setswitchinterval(before[1])


def _counted_ways(monkeypatch, module) -> list[str]:
    """The names of the threads that call ``module``'s ``give_way``, in order (it still gives way)."""
    calls: list[str] = []
    real = module.give_way
    monkeypatch.setattr(module, "give_way", lambda: (calls.append(threading.current_thread().name), real()))
    return calls


def _beside_a_turn(work):
    """``work()``'s result, run in background work of a thread named "writer" while a turn is held
    open the whole time (bounded: a writer that starves fails the test)."""
    result = {}

    def run() -> None:
        with FOREGROUND.background():
            result["out"] = work()

    with FOREGROUND.turn():
        writer = threading.Thread(target=run, name="writer")
        writer.start()
        writer.join(BOUND_S)
        assert not writer.is_alive(), "the writer starved beside a turn that never ended"
    return result["out"]


def test_a_disk_groups_whole_file_gives_way_between_its_chunks_while_a_turn_runs(tmp_path, monkeypatch):
    """A steady checkpoint at 10^7 keys writes a group or three whole (78 k keys each: about 100 ms
    of the writer's work, session 66); the writer gives way between the chunks it reads out of the
    store and between those it packs, not only between groups. A turn held open the whole time:
    it waits at each chunk, and the file is the group's."""
    import pickle

    from pescheduler.state import disk
    from pescheduler.state.base import key_group

    calls = _counted_ways(monkeypatch, disk)
    store = disk.DiskState(str(tmp_path / "store"), 64 << 20)
    group = key_group(0)
    keys = [k for k in range(700_000) if key_group(k) == group][:5_000]
    store.write_many({k: [k, 1.0] for k in keys})
    view = store.snapshot()
    view.reads_full([group])
    before = FOREGROUND.waited_s
    packed, count, _first = _beside_a_turn(lambda: view.full(group))
    chunks = -(-len(keys) // disk.RANGE_PAIRS)
    assert calls.count("writer") >= 2 * chunks, f"{calls.count('writer')} waits for {chunks} chunks read and packed"
    assert FOREGROUND.waited_s > before, "the writer never waited for the turn"
    assert count == len(keys) and pickle.loads(packed) == {k: [k, 1.0] for k in keys}
    view.release()
    store.close()


def test_a_disk_views_keys_written_since_its_snapshot_are_sorted_by_group_a_slice_at_a_time(tmp_path, monkeypatch):
    """A checkpoint's writer, at its first read of a ``disk`` view, sorts by key group the keys
    written since the snapshot (read at the snapshot instead). One ``set().union`` and one sort
    of them all held the GIL 30 ms at 10^5 keys (the PE's stall in a steady checkpoint at 10^7
    keys, traced). A turn held open the whole time: the writer gives way every
    ``MERGE_KEYS`` keys, and still reads the group as it was at the snapshot."""
    import pickle

    from pescheduler.state import disk
    from pescheduler.state.base import key_group

    store = disk.DiskState(str(tmp_path / "store"), 64 << 20)
    keys = list(range(20_000))
    store.write_many({k: [k, 1.0] for k in keys})
    view = store.snapshot()
    store.write_many({k: [k, 2.0] for k in keys})     # since the snapshot: in the store now
    store._flush()
    store._dirty.merged()                               # (its own slices are not the ones counted)
    group = key_group(0)
    calls = _counted_ways(monkeypatch, disk)
    pairs = _beside_a_turn(lambda: view.raw(group))
    slices = len(keys) // disk.MERGE_KEYS
    assert calls.count("writer") >= slices, f"{calls.count('writer')} waits for {slices} slices of keys written since"
    mine = [k for k in keys if key_group(k) == group]
    assert {disk._decode(raw): pickle.loads(value) for raw, value in pairs} == {k: [k, 1.0] for k in mine}
    view.release()
    store.close()
