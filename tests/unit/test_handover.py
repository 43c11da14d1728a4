"""Key-group hand-over on a rescale: which groups move between which instances (plan/state.py's
group_moves), the reconfiguration plan that keeps running instances running, and the worker's
export and import of groups (worker/handover.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from types import SimpleNamespace

import cloudpickle
import pytest

from pescheduler import Application
from pescheduler.actions import Move, Release, Replicate, Split
from pescheduler.control.protocol import plan_reconfiguration
from pescheduler.plan.compiler import compile_app
from pescheduler.plan.state import group_moves
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import channel_ids
from pescheduler.plugins import load_plugins
from pescheduler.testing import run_operators
from pescheduler.state import MemoryState, pack_group
from pescheduler.state.groups import PackedOnPickle, take_groups
from pescheduler.wire import KEY_GROUPS, PESpec, key_group
from pescheduler.worker.handover import HandOvers, export_groups, import_groups

from keyed_handover import WORKERS, placed_keyed_window
from operators.count_window import CountWindow
from support_ops import RunningSum


def test_a_replicate_keeps_the_original_running_and_moves_only_the_copys_groups():
    old, window = placed_keyed_window()
    new = transform(old, Replicate(window, 1))
    plan = plan_reconfiguration(old, new, channel_ids(old, "d", 0), "d", 1)
    copy = f"{window}#1"
    assert plan.retired == () and plan.created == (new.pe_of(copy),)
    (move,) = plan.moves
    assert (move.src, move.dst, move.src_live, move.dst_live) == (window, copy, True, False)
    assert set(move.groups) == set(new.routes[window].key_groups[copy])
    assert 0 < len(move.groups) < KEY_GROUPS
    assert plan.carry == ()                     # nothing retires: nothing hands its input over


def test_a_release_retires_only_the_copy_whose_groups_go_to_the_running_original():
    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    one = transform(two, Release(window, 1))
    plan = plan_reconfiguration(two, one, channel_ids(two, "d", 1), "d", 2)
    copy = f"{window}#1"
    assert plan.retired == (two.pe_of(copy),) and plan.created == ()
    (move,) = plan.moves
    assert (move.src, move.dst, move.src_live, move.dst_live) == (copy, window, False, True)
    assert set(move.groups) == set(two.routes[window].key_groups[copy])
    # its groups all go to the gating original, but a count window fires on watermarks: a tuple
    # on time at the copy could be late at the original, so its queued input does not go along
    assert plan.carry == (), plan.carry


@pytest.mark.parametrize("op", ["running_sum", "latest", "count_window", "session_window"])
def test_a_releases_copy_carries_its_queued_input_only_where_event_time_does_not_judge_it(op):
    """``plan.carry`` (carried_input.py): a Release's copy whose groups all go to the gating
    original hands its queued input over with them, and its upstream's marker overtakes what it
    buffers for it, unless its operator has an event-time hook (``plan.state.carries``): then it
    drains as before."""
    app = Application("t")
    keyed = app.source("numbers", count=10**9, keys=50).key_by("key")
    if op == "count_window":
        keyed = keyed.window(count=10, aggregates={"total": ("sum", "n")})
    elif op == "session_window":
        keyed = keyed.window(gap=100, aggregates={"total": ("sum", "n")})
    else:
        keyed = keyed.apply(op)
    keyed.sink("collect")
    old = compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})
    x = next(o for o in old.plan.ops if o.startswith(op))
    two = transform(old, Replicate(x, 1))
    plan = plan_reconfiguration(two, transform(two, Release(x, 1)), channel_ids(two, "d", 1), "d", 2)
    assert all(m.dst_live for m in plan.moves)
    expected = () if op.endswith("window") else (two.pe_of(f"{x}#1"),)
    assert plan.carry == expected, plan.carry
    # the upstream's marker overtakes what it buffers for a copy that carries: the backlog goes
    # to the original's gate, behind the carried tuples (protocol._overtakable)
    held = {c for cs in plan.hold.values() for c in cs}
    overtaken = {c for cs in plan.overtake.values() for c in cs}
    assert held and overtaken == (held if expected else set()), (plan.hold, plan.overtake)


def test_a_moved_copy_takes_all_its_groups_from_its_old_pe():
    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    copy_pe = two.pe_of(f"{window}#1")
    there = next(w for w in WORKERS if w != two.pes[copy_pe].worker)
    moved = transform(two, Move(copy_pe, there))
    (move,) = group_moves(two, moved)[window]
    assert (move.src_worker, move.dst_worker, move.src_live, move.dst_live) == (two.pes[copy_pe].worker, there,
                                                                              False, False)
    assert set(move.groups) == set(two.routes[window].key_groups[f"{window}#1"])


def test_a_copy_that_stays_and_gives_groups_away_replaces_every_instance():
    """A second copy takes groups from the first, whose PE holds no router: no live export, the
    old way (all instances replaced, state re-split)."""
    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    three = transform(two, Replicate(window, 1))
    assert window not in group_moves(two, three)
    plan = plan_reconfiguration(two, three, channel_ids(two, "d", 1), "d", 2)
    assert set(plan.retired) == {two.pe_of(window), two.pe_of(f"{window}#1")}


def _fed(op, n=2000, keys=300):
    """``op`` after ``n`` tuples over ``keys`` keys, opened as a PE would."""
    run_operators([{"key": i % keys, "n": i, "ts": i} for i in range(n)], op, key_field="key")
    return op


def test_a_count_window_exports_only_the_moving_groups_and_imports_them_exactly():
    whole = _fed(CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key"))
    moving = frozenset(range(0, KEY_GROUPS, 3))
    kept = _fed(CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key"))
    part = export_groups(kept, moving)
    assert set(part["groups"]) == {g for g in whole._keys.groups() if g in moving}
    assert not set(kept._keys.groups()) & moving
    fresh = CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key")
    fresh.restore(cloudpickle.loads(cloudpickle.dumps(part)))
    assert set(fresh._keys.groups()) == set(part["groups"])
    import_groups(kept, cloudpickle.loads(cloudpickle.dumps(part)))
    assert _state(kept) == _state(whole)


def test_a_time_windows_memory_export_takes_the_panes_whole_and_reads_the_moving_groups_off_the_turn():
    """The time window on ``memory`` keeps its panes as dicts (not by key group): its export takes
    each pane's layers as they are, O(panes), and reads the moving groups' entries only when the
    part is pickled, off the PE's turn (``TakenPane``; before, one pass over the panes' keys in
    the turn: 0.4-0.5 s at 10^6 keys). The window that kept the rest no longer sees the moving
    keys (hidden in its layers, ``Left``); in process or pickled, with the parts imported back,
    it holds what one that never moved holds, and fires it."""
    from operators.pane_layers import TakenPane
    from operators.window import Window
    from pescheduler.operator import Emitter

    def fed():                          # panes of several starts, none fired (no watermark)
        from pescheduler import OperatorContext
        w = Window(size=100, slide=50, aggregates={"total": ("sum", "n")}, key="key")
        w.open(OperatorContext(op_id="w", pe_id="t", key_field="key", extra={}))
        w.process([{"key": i % 300, "n": i, "ts": i} for i in range(2000)], Emitter())
        return w

    def panes(w):
        return {p: dict(w._layers.items(w._panes, p)) for p in w._panes}

    whole, kept, moving = fed(), fed(), frozenset(range(0, KEY_GROUPS, 3))
    part = export_groups(kept, moving)
    assert set(part["groups"]) == moving
    assert all(type(data) is TakenPane and key_group(k) == g for g, (k, data) in part["groups"].items())
    assert all(key_group(k) not in moving for table in panes(kept).values() for k in table)
    fresh = Window(size=100, slide=50, aggregates={"total": ("sum", "n")}, key="key")
    fresh.restore(cloudpickle.loads(cloudpickle.dumps(part)))
    fresh._unstash()
    assert {key_group(k) for table in fresh._panes.values() for k in table} <= moving
    import_groups(kept, part)                                   # in process: not pickled
    assert panes(kept) == panes(whole)
    fired, expected = Emitter(), Emitter()
    kept.on_watermark(10_000, fired)
    whole.on_watermark(10_000, expected)
    assert sorted(map(sorted, (r.items() for r in fired))) == sorted(map(sorted, (r.items() for r in expected)))


def _state(window) -> dict:
    keys = window._keys
    return {k: v for g in keys.groups() for k, v in keys.items(g)}


def test_a_moves_slices_walk_its_export_once_a_level_and_are_the_slices_of_it(monkeypatch):
    """A Move exports every group of its PE in its pause and, after it, cuts the export into 32
    slices (``SLICE_GROUPS``): by halves, each key's group computed once, not a split of the whole export
    for each slice (a count window's waiting tuples walked 32 times: 17 of the 19 ms of the export
    at 10^3 keys, in the pause). Each slice is what a split of the export by its groups gives."""
    from pescheduler.worker import handover

    def fed() -> CountWindow:
        op = _fed(CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key"))
        op._pending = [(i, i % 3000, {"key": i % 3000, "n": i, "ts": i}) for i in range(6000)]   # held by the watermark
        return op
    calls = []
    monkeypatch.setattr(handover, "key_group", lambda key, *a: (calls.append(key), key_group(key, *a))[1])
    pe = SimpleNamespace(ops={"w": fed()}, chain=SimpleNamespace(progress=lambda: {"w": 7}),
                         rewirer=SimpleNamespace(carried=None, pending={}))
    parts = handover.exported(pe, {"src": "w", "groups": list(range(KEY_GROUPS)), "tag": "t", "dst_live": False})
    assert len(calls) <= 3000 + KEY_GROUPS, f"{len(calls):,} groups computed for 3,000 keys"
    whole, slices = export_groups(fed(), frozenset(range(KEY_GROUPS))), [
        list(range(i, i + handover.SLICE_GROUPS)) for i in range(0, KEY_GROUPS, handover.SLICE_GROUPS)]
    assert [p["groups"] for p in parts] == slices and all(p["progress"] == 7 for p in parts)
    for part, s in zip(parts, slices):
        alone = CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key").split_state(
            whole, lambda key, mine=frozenset(s): key_group(key) in mine)
        assert part["state"]["pending"] == alone["pending"] and part["state"]["groups"].keys() == alone["groups"].keys()
    assert sum(len(p["state"]["pending"]) for p in parts) == 6000


def test_a_moves_export_is_cut_into_its_parts_after_the_pause_not_in_it(monkeypatch):
    """``pe_handover`` (in the pause) takes the groups; the cut into slices walks the export (a
    count window's waiting tuples, a level of halves at a time) and waits for the pause's end (the
    move's ``go``). On the code before, the call cut it: 2-7 ms of a Move's pause at 10^6 keys
    with 5,600 tuples waiting."""
    cuts, sent = [], []
    split = CountWindow.split_state
    monkeypatch.setattr(CountWindow, "split_state", lambda self, *a: (cuts.append(1), split(self, *a))[1])
    op = _fed(CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key"))
    op._pending = [(i, i % 3000, {"key": i % 3000, "n": i, "ts": i}) for i in range(6000)]
    pe = SimpleNamespace(ops={"w": op}, chain=SimpleNamespace(progress=lambda: {"w": 7}),
                         rewirer=SimpleNamespace(carried=None, pending={}), turns=SimpleNamespace(lock=asyncio.Lock()))

    class Peer:
        async def pe_handover_put(self, deployment, move, blob):
            sent.append(cloudpickle.loads(blob)["groups"])

    async def scenario():
        here = HandOvers(lambda d: {"pe": pe}, lambda address: Peer(), lambda: "tcp://a")
        move = {"src": "w", "src_pe": "pe", "dst": "w", "dst_pe": "new", "dst_worker": "tcp://b", "dst_live": False,
                "groups": list(range(KEY_GROUPS)), "tag": "m", "go": 10}
        answer = await here.pe_handover("d", [move])
        in_the_pause = len(cuts)
        await here.pe_handover_go("d", "m")
        await asyncio.wait_for(asyncio.gather(*here.sending), 10)
        return answer, in_the_pause
    answer, in_the_pause = asyncio.run(scenario())
    assert in_the_pause == 0, f"{in_the_pause} splits of the export in the pause's call"
    assert answer == {"parts": KEY_GROUPS // 4} and cuts
    assert sent == [list(range(g, g + 4)) for g in range(0, KEY_GROUPS, 4)]


def test_an_export_that_cannot_be_cut_fails_its_move_and_says_why():
    """The cut runs after the pause, in the background task that sends the parts: an operator's
    ``split_state`` that raises there fails the move (its gates stay pending; the wait says why),
    as it failed the pause's call when the export was cut in it."""
    class Uncuttable(CountWindow):
        def split_state(self, state, owns):
            raise ValueError("no split here")

    op = _fed(Uncuttable(count=7, aggregates={"total": ("sum", "n")}, key="key"))
    pe = SimpleNamespace(ops={"w": op}, chain=SimpleNamespace(progress=lambda: {"w": 7}),
                         rewirer=SimpleNamespace(carried=None, pending={}), turns=SimpleNamespace(lock=asyncio.Lock()))

    async def scenario():
        here = HandOvers(lambda d: {"pe": pe}, lambda address: None, lambda: "tcp://a")
        move = {"src": "w", "src_pe": "pe", "dst": "w", "dst_pe": "new", "dst_worker": "tcp://b", "dst_live": False,
                "groups": list(range(KEY_GROUPS)), "tag": "m"}
        await here.pe_handover("d", [move])
        await asyncio.wait_for(asyncio.gather(*here.sending), 10)
        return here.failed
    failed = asyncio.run(scenario())
    assert "no split here" in failed.get(("d", "m"), ""), failed


def test_an_operator_without_the_hooks_moves_groups_by_split_and_merge():
    whole, kept = _fed(RunningSum()), _fed(RunningSum())
    moving = frozenset(range(64))
    part = export_groups(kept, moving)
    assert part and all(key_group(k) in moving for k in part)
    assert kept.sums and all(key_group(k) not in moving for k in kept.sums)
    import_groups(kept, part)
    assert kept.sums == whole.sums


def test_taken_groups_leave_the_state_at_once_and_are_packed_only_when_pickled():
    state = MemoryState()
    for i in range(1000):
        state.put(f"car-{i}", [i])
    view = state.snapshot()                       # a checkpoint's view still reads them
    moving = set(state.groups()[::2])
    taken = state.take_groups(moving)
    assert set(taken) == moving and not moving & set(state.groups())
    assert all(state.get(k) is None for g in moving for k in taken[g])
    assert all(dict(view.items(g)) == taken[g] for g in moving)
    g = min(moving)
    assert cloudpickle.loads(cloudpickle.dumps(PackedOnPickle(taken[g], g))) == pack_group(taken[g].items())


def _take_s(keys: int) -> float:
    """Best of 5: a rescale's take (what each operator's ``export_groups`` does in the PE's turn)
    of half the key groups of a memory state holding ``keys`` keys, while a checkpoint's view is
    live and the same 500 keys were written since it; the groups are put back after each. The
    PE thread's CPU time: on a loaded machine the wall time also held the wait for the GIL while
    the leave thread's first slice ran (up to LEAVE_KEYS pops: bounded, but more keys per group
    at 2*10^5), which made the test fail now and then (0.7 ms at 2*10^4, 6.1 ms at 2*10^5, load 8)."""
    state, best = MemoryState(), float("inf")
    state.write_many((f"car-{i}", [i]) for i in range(keys))
    for _ in range(5):
        view = state.snapshot()
        for i in range(500):
            state.put(f"car-{i}", [-i])
        gc.collect()
        gc.disable()                    # the take's own work, not a collection of the test's heap
        try:
            t = time.thread_time()
            taken = take_groups(state, frozenset(range(0, KEY_GROUPS, 2)))
            best = min(best, time.thread_time() - t)
        finally:
            gc.enable()
        assert all(state.get(f"car-{i}") is None for i in range(500) if key_group(f"car-{i}") % 2 == 0)
        assert dict(taken[key_group("car-0")][1].entries)["car-0"] == [0]     # the write since the view
        view.release()
        state.import_groups({g: packed.entries for g, (_key, packed) in taken.items()})
    assert len(state) == keys and state.get("car-2") == [-2]
    return best


def test_a_rescales_take_in_the_pes_turn_does_not_grow_with_the_keys_held():
    """The pause of a Replicate must not hold work proportional to the state (issue 30): 10x the
    keys, the same writes since the checkpoint, and the take costs about the same (it removed every
    taken key from the index, and copied each group the live view shared: 10x, and ~1 s at 10^6)."""
    small, large = _take_s(20_000), _take_s(200_000)
    # What is left of the take still grows with the keys held, below linear: 0.4 -> 2.0 ms (this code),
    # 0.65 -> 3.0 ms (session 18's), quiet. A bound of 3x + 2 ms sat on that and failed once in the
    # loaded whole suite (4.94 against 4.91 ms). A take that walks the keys held grows 10x.
    assert large < 6 * small + 0.002, f"take {small * 1000:.1f} ms at 2*10^4 keys, {large * 1000:.1f} ms at 2*10^5"


def _take_after_writes_s(written: int) -> float:
    """Best of 3: a rescale's take of half the key groups of a memory state holding ``written``
    keys, each written twice since the last fold (bench/state.py's first Replicate, right after
    the fill): once before a checkpoint's snapshot, whose deferred fold its writer has not applied
    yet (the view is live), and once since it. The PE thread's CPU time, the collector off."""
    best, half = float("inf"), frozenset(range(0, KEY_GROUPS, 2))
    for round_ in range(3):
        state = MemoryState()
        state.write_many((f"car-{i}", [i]) for i in range(written))
        state.snapshot().release()                  # folded by the next snapshot: the groups are not empty
        state.write_many((f"car-{i}", [i, 1]) for i in range(written))
        view = state.snapshot()                     # its fold deferred and not read yet
        state.write_many((f"car-{i}", [i, 2]) for i in range(written))
        gc.collect()
        gc.disable()
        try:
            t = time.thread_time()
            taken = take_groups(state, half)
            best = min(best, time.thread_time() - t)
        finally:
            gc.enable()
        if round_:                      # what the take gave, read once (4 of the 7 s a round at 2*10^5)
            view.release()
            continue
        mine = {f"car-{i}": [i, 2] for i in range(written) if key_group(f"car-{i}") in half}
        assert {k: v for _g, (_k, packed) in taken.items() for k, v in packed.entries.items()} == mine
        assert all(key_group(first) == g for g, (first, _packed) in taken.items())
        assert {k: v for g in view.groups() for k, v in view.items(g)} == \
            {f"car-{i}": [i, 1] for i in range(written)}               # the view still reads the snapshot
        assert not any(key_group(k) in half for k in state.writable())
        assert len(state) == written - len(mine) and state.get("car-1") == (None if "car-1" in mine else [1, 2])
        view.release()
    return best


def test_a_rescales_take_in_the_pes_turn_does_not_grow_with_the_keys_written_since_the_checkpoint():
    """The first Replicate after a fill took 116-1,330 ms at 10^6 keys (bench/state.py, loaded): the
    take sorted every key written since the last fold into its group, in the turn (345,458 of them),
    and applied its groups' part of the snapshot's deferred fold. 10x the keys written, and the
    take costs about the same: it visits no key (the packer and the leave thread do, off the turn)."""
    small, large = _take_after_writes_s(20_000), _take_after_writes_s(200_000)
    assert large < 3 * small + 0.002, \
        f"take {small * 1000:.1f} ms with 2*10^4 keys written since the fold, {large * 1000:.1f} ms with 2*10^5"


class _Recording:
    """A deployment's worker calls, answered at once as aligned, drained and moved workers would,
    each noted (``calls``): the protocol's order and arguments, no worker needed."""

    deployment = "d"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def pause(self, worker, marker, **todo):
        self.calls.append(("pause", worker))

    async def drain_status(self, worker, marker, aligned, seen, timeout, queued=None):
        return {"missing": [], "failed": [], "progress": 0, "times": {}}

    async def handover_expect(self, worker, moves):
        self.calls.append(("handover_expect", worker))
        return {"gated": sum(len(m["groups"]) for m in moves)}

    async def handover(self, worker, moves, stop=(), snapshot=(), leave_out=()):
        self.calls.append(("handover", worker, [m["src"] for m in moves]))
        answer = {"parts": len(moves)}
        if snapshot:                   # retired PEs snapshotted in the same call, right after the export
            self.calls.append(("snapshot", worker, list(snapshot), list(leave_out)))
            answer["snapshot"] = cloudpickle.dumps({p: {} for p in snapshot})
        if stop:                       # retired PEs stopped in the same call, right after the export
            self.calls.append(("stop", worker, list(stop)))
        return answer

    async def snapshot(self, worker, pe_ids, leave_out=()):
        self.calls.append(("snapshot", worker, list(pe_ids), list(leave_out)))
        return cloudpickle.dumps({})

    async def stop_pes(self, worker, pe_ids):
        self.calls.append(("stop", worker, list(pe_ids)))
        return list(pe_ids)

    async def rewire(self, worker, pe_id, **changes):
        if changes.get("expect"):      # the gates set in the same call, before its routers switch
            self.calls.append(("handover_expect", worker))
        self.calls.append(("rewire", worker, pe_id))
        return {}

    async def deploy(self, worker, specs):
        self.calls.append(("deploy", worker))
        return {}

    async def handover_go(self, worker, tag):
        self.calls.append(("go", worker))

    async def handover_wait(self, worker, tag, timeout):
        return {"groups": 0, "pending": 0, "bytes": 0, "buffered": 0, "done_at": time.time(), "failed": None}


def test_a_releases_retired_copy_is_not_snapshotted_for_the_groups_it_handed_over():
    """A Release's copy gives every key group to the running original before the snapshot step,
    which redistribute would then throw away: the retired PE must not take it (on ``disk`` the
    emptied store's groups were read through every key dropped by range: 22-44 ms of the pause at
    5 * 10^5 keys). Its other operators (none here) would still be snapshotted."""
    from pescheduler.control.protocol import execute

    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    one = transform(two, Release(window, 1))
    plan = plan_reconfiguration(two, one, channel_ids(two, "d", 1), "d", 2)
    gateway, steps, copy = _Recording(), {}, f"{window}#1"
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    asyncio.run(execute(gateway, two, one, plan, info, "d/reconf/2", 5.0, steps))
    snapshots = [c for c in gateway.calls if c[0] == "snapshot"]
    assert all(copy in c[3] for c in snapshots), f"the retired copy's snapshot took {copy}: {snapshots}"
    # its PE holds nothing else: it is not asked at all (an empty answer, a round trip in the pause)
    assert snapshots == [], f"the retired copy's PE, holding nothing left to snapshot, was asked: {snapshots}"
    assert [c[0] for c in gateway.calls].index("handover") < [c[0] for c in gateway.calls].index("stop")


def test_a_releases_gate_and_hand_over_are_asked_at_once():
    """The running original gates the groups coming back (``handover_expect``) and the retired copy
    exports them (``handover``) in one round of calls: the parts of a deferred move go at the
    ``go``, after the pause, so the gate is in place before they come. In turn they were two round
    trips to two busy worker loops in the pause. Here the gate answers only once the export was
    asked: in turn, the step waits for ever (bounded)."""
    from pescheduler.control.protocol import ReconfigurationFailed, execute

    class OneRound(_Recording):
        def __init__(self) -> None:
            super().__init__()
            self.exporting = asyncio.Event()

        async def handover_expect(self, worker, moves):
            await self.exporting.wait()
            return await super().handover_expect(worker, moves)

        async def handover(self, worker, moves, stop=(), **more):
            self.exporting.set()
            return await super().handover(worker, moves, stop, **more)

    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    one = transform(two, Release(window, 1))
    plan = plan_reconfiguration(two, one, channel_ids(two, "d", 1), "d", 2)
    assert any(m.dst_live for m in plan.moves), "the original gates the groups coming back"
    gateway, steps = OneRound(), {}
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    try:
        asyncio.run(execute(gateway, two, one, plan, info, "d/reconf/2", 2.0, steps))
    except ReconfigurationFailed as exc:
        raise AssertionError(f"the gate and the export were asked in turn: {exc}") from None
    assert {c[0] for c in gateway.calls} >= {"handover_expect", "handover"}


def test_a_releases_pause_does_not_wait_for_the_consumer_to_take_the_copys_last_batches():
    """The consumer downstream of a released copy takes the copy's marker only behind its backlog:
    the pause waits until the marker is queued there (behind the copy's last batches), not taken.
    The groups the copy gives back wait at the running original's gate; their parts go (``go``)
    only once the consumer took the marker, and its input from the copy is removed then. On main
    the drain waited for the take, here one that comes only after the switch: ``did not drain``
    (session 21: 119 of a 166 ms Release at 10^6 keys on disk was that wait)."""
    from pescheduler.control.protocol import ReconfigurationFailed, execute

    class SlowConsumer(_Recording):
        """The consumer has the copy's marker queued at once and takes it once the upstream's
        routers switched (the pause's end): a backlog longer than the pause."""

        def __init__(self, consumer) -> None:
            super().__init__()
            self.consumer, self.switched = consumer, asyncio.Event()

        async def drain_status(self, worker, marker, aligned, seen, timeout, queued=None):
            times = {f"{p}<-copy queued": time.time() for p in queued or {}}
            if self.consumer in seen and not self.switched.is_set():
                try:
                    await asyncio.wait_for(self.switched.wait(), timeout)
                except asyncio.TimeoutError:
                    return {"missing": [f"{self.consumer}<-copy"], "failed": [], "progress": 0, "times": times}
            if self.consumer in seen:
                self.calls.append(("taken", self.consumer))
            return {"missing": [], "failed": [], "progress": 0, "times": times}

        async def rewire(self, worker, pe_id, **changes):
            if "remove_outputs" in changes:          # the upstream's switch: the pause is over
                self.switched.set()
            self.calls.append(("rewire in" if "remove_inputs" in changes else "rewire out", pe_id))
            return {}

    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    one = transform(two, Release(window, 1))
    plan = plan_reconfiguration(two, one, channel_ids(two, "d", 1), "d", 2)
    (consumer,) = plan.seen
    gateway, steps = SlowConsumer(consumer), {}
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    try:
        asyncio.run(execute(gateway, two, one, plan, info, "d/reconf/2", 2.0, steps))
    except ReconfigurationFailed as exc:
        raise AssertionError(f"the pause waited for the consumer's take: {exc}") from None
    order = [c[0] for c in gateway.calls]
    # the copy stops in the round of the switch (``_switch_with_hand_over``), both before the take
    assert max(order.index("stop"), order.index("rewire out")) < order.index("taken") < order.index("go"), gateway.calls
    assert ("rewire in", consumer) in gateway.calls and order.index("rewire in") > order.index("taken"), gateway.calls
    assert f"drain {consumer}<-copy queued" in steps, steps                    # the pause's drain: queued
    assert f"order: rewire in {consumer}" in steps and "order: downstream took the retired PEs' marker" in steps, steps


@pytest.mark.parametrize("op", ["join_asof", "join"])
def test_a_two_input_operators_moves_are_gated_and_carry_no_input(op):
    """A join reads two inputs (``process_input``): its gate holds each pending group's tuples
    with the input they came on (pending_groups.py), so its Replicate's copy is deployed and
    wired before the pause and its groups come after it, and a Release's groups go to the
    gating original, as a one-input operator's. Before, its moves were blocking: the copy was
    built from its groups inside the pause, which grew with the moving state (an as-of join of
    10^6 keys: 1.8-2.7 s, bench/rescale_ops.py). Its queued input is never carried (a carried
    tuple has no input to go with, and a join fires on watermarks)."""
    from pescheduler.control.protocol import _gates, _opens_early
    app = Application("t")
    left = app.source("numbers", count=10**9, keys=50).key_by("key")
    right = app.source("numbers", count=10**9, keys=50).key_by("key")
    (left.join_asof(right, by="key") if op == "join_asof" else left.join(right, within=100)).sink("collect")
    old = compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})
    x = next(o for o in old.plan.ops if o.startswith(op))
    two = transform(old, Replicate(x, 1))
    grown = plan_reconfiguration(old, two, channel_ids(old, "d", 0), "d", 1)
    assert grown.moves and _opens_early(grown), grown.moves
    shrunk = plan_reconfiguration(two, transform(two, Release(x, 1)), channel_ids(two, "d", 1), "d", 2)
    assert shrunk.moves and all(m.dst_live for m in shrunk.moves), shrunk.moves
    assert sum(len(g["groups"]) for gs in _gates(shrunk, "m", 10.0).values() for g in gs) == \
        sum(len(m.groups) for m in shrunk.moves)
    assert shrunk.carry == (), shrunk.carry


def test_a_time_windows_moves_are_gated_and_its_copy_waits_for_the_order_at_its_gate():
    """The keyed time window is columnar (Arrow batches folded vectorised): its gate takes such a
    batch as rows (pending_groups.py), so its moves are deferred (session 46). Before, they were
    blocking: its copy was built from its groups inside the pause (1.3-1.7 s at 10^6 keys,
    bench/rescale_ops.py) and held whole until downstream took the original's marker. Now the
    copy runs at once, gated, and the groups leave only after that order wait (the ``go``)."""
    from pescheduler.control.protocol import _awaited_moves, _opens_early
    app = Application("t")
    (app.source("numbers", count=10**9, keys=50).key_by("key")
        .window(size=1000, aggregates={"count": ("count", "n")}).map(lambda t: t).sink("collect"))
    old = compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})
    window = next(op for op in old.plan.ops if op.startswith("window"))
    consumer = next(op for op in old.plan.ops if op.startswith("map"))
    old = transform(old, Split(old.pe_of(window), (consumer, next(o for o in old.plan.ops if o.startswith("collect"))),
                               worker=WORKERS[1]))
    new = transform(old, Replicate(window, 1))
    plan = plan_reconfiguration(old, new, channel_ids(old, "d", 0), "d", 1)
    (move,) = plan.moves
    assert move.src_live and _opens_early(plan), "the copy is deployed before the pause, gated"
    assert set(plan.ordered) == {old.pe_of(consumer)}, plan.ordered
    assert _awaited_moves(plan, "m1")[f"{window}#1"] == {"handover": "m1", "groups": list(move.groups)}


class _Rounds(_Recording):
    """:class:`_Recording` whose workers answer the drain's first look with the pause (as a worker
    does when asked: ``PEHost.pe_reconf``'s ``drain``), and that counts rounds of calls: a round
    begins when a call is asked while none is out (calls asked together, in one ``gather``, are
    one round: one wait for the busiest loop among them). ``switched``: the rounds up to the
    running original's router switch (the rewire that removes its output to the copy: the
    pause's end)."""

    def __init__(self) -> None:
        super().__init__()
        self.out, self.rounds, self.switched = 0, 0, None

    async def _call(self, answer):
        if self.out == 0:
            self.rounds += 1
        self.out += 1
        await asyncio.sleep(0)              # calls asked together are all out at once
        self.out -= 1
        return answer

    async def pause(self, worker, marker, drain=None, **todo):
        self.calls.append(("pause", worker))
        return await self._call({"missing": [], "failed": [], "progress": 0, "times": {}} if drain else None)

    async def drain_status(self, worker, marker, aligned, seen, timeout, queued=None):
        self.calls.append(("drain_status", worker))
        return await self._call({"missing": [], "failed": [], "progress": 0, "times": {}})

    async def handover_expect(self, worker, moves):
        return await self._call(await super().handover_expect(worker, moves))

    async def handover(self, worker, moves, stop=(), **more):
        return await self._call(await super().handover(worker, moves, stop, **more))

    async def snapshot(self, worker, pe_ids, leave_out=()):
        return await self._call(await super().snapshot(worker, pe_ids, leave_out))

    async def deploy(self, worker, specs):
        return await self._call(await super().deploy(worker, specs))

    async def stop_pes(self, worker, pe_ids):
        return await self._call(await super().stop_pes(worker, pe_ids))

    async def rewire(self, worker, pe_id, **changes):
        answer = await self._call(await super().rewire(worker, pe_id, **changes))
        if changes.get("remove_outputs") and self.switched is None:
            self.switched = self.rounds
        return answer


def test_a_releases_pause_is_two_rounds_of_calls_to_the_workers():
    """A Release's pause was five rounds of calls, each waiting for a busy worker loop (a PE's
    turn, a GC, the checkpoint writer holding the GIL: 8-41 ms each at 10^6 keys, traced): the
    pause, the drain's first look, the hand-over, the copy's stop and the original's switch. Now
    each pause call answers its worker's first look at the drain; the copy, with nothing left
    to snapshot, stops in the call that exports its groups; and the original gates the groups
    coming back in the call that switches its router, in that same round. On main: 5 rounds,
    ``drain_status`` asked and a ``stop_pes`` of its own."""
    from pescheduler.control.protocol import execute

    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    one = transform(two, Release(window, 1))
    plan = plan_reconfiguration(two, one, channel_ids(two, "d", 1), "d", 2)
    (copy_pe,) = plan.retired
    gateway, steps = _Rounds(), {}
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    asyncio.run(execute(gateway, two, one, plan, info, "d/reconf/2", 5.0, steps))
    assert gateway.switched == 2, f"{gateway.switched} rounds to the switch: {gateway.calls}"
    kinds = [c[0] for c in gateway.calls]
    switch = kinds.index("rewire")
    assert "drain_status" not in kinds[:switch], gateway.calls        # its first look came with the pause
    assert kinds[switch - 1] == "handover_expect", gateway.calls     # gated in the switch's own call, first
    stops = [c for c in gateway.calls if c[0] == "stop"]
    assert stops == [("stop", two.pes[copy_pe].worker, [copy_pe])], gateway.calls   # once, in the hand-over's call
    assert kinds.index("handover") < kinds.index("stop") < kinds.index("go"), gateway.calls  # after its groups left


def test_a_moves_pause_is_three_rounds_of_calls_to_the_workers():
    """A Move of a PE holding a KEYED operator and another (the window and its sink) re-deploys it
    on the other worker, every key group handed over worker to worker. Its pause was five rounds
    of calls to busy worker loops: the pause, the hand-over, the snapshot of the sink, the stop
    and the new PE's deploy with the upstream's switch (62-129 ms at 10^3 keys). The old PE is now
    snapshotted and stopped in the call that exports its groups, right after the export: three."""
    from pescheduler.control.protocol import execute

    old, window = placed_keyed_window()
    pe = old.pe_of(window)
    assert len(old.pes[pe].operators) > 1, old.pes[pe].operators     # something besides the window to snapshot
    there = next(w for w in WORKERS if w != old.pes[pe].worker)
    moved = transform(old, Move(pe, there))
    plan = plan_reconfiguration(old, moved, channel_ids(old, "d", 1), "d", 2)
    assert plan.retired == (pe,) and not any(m.src_live for m in plan.moves), plan
    gateway = _Rounds()
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    asyncio.run(execute(gateway, old, moved, plan, info, "d/reconf/2", 5.0, {}))
    kinds = [c[0] for c in gateway.calls]
    assert gateway.rounds == 3, f"{gateway.rounds} rounds: {gateway.calls}"
    (handover,) = [i for i, c in enumerate(gateway.calls) if c[0] == "handover"]
    assert gateway.calls[handover + 1][:3] == ("snapshot", old.pes[pe].worker, [pe]), gateway.calls
    assert window in gateway.calls[handover + 1][3], "the window's groups went with the hand-over, not the snapshot"
    assert gateway.calls[handover + 2] == ("stop", old.pes[pe].worker, [pe]), gateway.calls
    assert kinds.count("snapshot") == 1 and kinds.count("stop") == 1, gateway.calls
    assert kinds.index("stop") < kinds.index("deploy"), gateway.calls


def test_a_worker_that_answers_no_first_look_is_asked_by_the_drain():
    """A worker of an older version (or a fake) answers nothing to the pause's ``drain``: the drain
    then asks it as before, so the protocol needs no worker to know the merged call."""
    from pescheduler.control.protocol import execute

    class Older(_Rounds):
        async def pause(self, worker, marker, drain=None, **todo):
            self.calls.append(("pause", worker))
            return await self._call(None)

    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))
    one = transform(two, Release(window, 1))
    plan = plan_reconfiguration(two, one, channel_ids(two, "d", 1), "d", 2)
    gateway = Older()
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    asyncio.run(execute(gateway, two, one, plan, info, "d/reconf/2", 5.0, {}))
    switch = next(i for i, c in enumerate(gateway.calls) if c[0] == "rewire")
    assert "drain_status" in [c[0] for c in gateway.calls[:switch]], gateway.calls


def test_a_hand_over_call_stops_the_pes_it_names_after_the_export():
    """``pe_handover``'s ``stop``: the PEs named stop in the same call (``PEHost.pe_stop``), once
    their groups were exported; on main the argument did not exist (a stop was a call of its own)."""
    stopped = []

    async def stop(deployment, pe_ids):
        stopped.append((deployment, pe_ids))
        return pe_ids

    async def scenario():
        host = HandOvers(lambda d: {}, lambda address: None, lambda: "tcp://here", stop=stop)
        return await host.pe_handover("d", [], stop=["copy"])
    answer = asyncio.run(scenario())
    assert stopped == [("d", ["copy"])] and answer["stopped"] == ["copy"], (stopped, answer)


def test_a_hand_over_call_snapshots_then_stops_the_pes_it_names_after_the_export():
    """``pe_handover``'s ``snapshot`` (a Move's PE): the PEs named are snapshotted, but the
    operators ``leave_out`` names, after the export, then stopped, in the same call; the snapshot
    is answered as ``PEHost.pe_snapshot`` answers it. On main the argument did not exist."""
    order = []

    async def snapshot(deployment, pe_ids, leave_out):
        order.append(("snapshot", deployment, pe_ids, leave_out))
        return cloudpickle.dumps({"pe": {"sink": {"n": 1}}})

    async def stop(deployment, pe_ids):
        order.append(("stop", deployment, pe_ids))
        return pe_ids

    async def scenario():
        host = HandOvers(lambda d: {}, lambda address: None, lambda: "tcp://here", stop=stop, snapshot=snapshot)
        return await host.pe_handover("d", [], stop=["pe"], snapshot=["pe"], leave_out=["window"])
    answer = asyncio.run(scenario())
    assert order == [("snapshot", "d", ["pe"], ["window"]), ("stop", "d", ["pe"])], order
    assert cloudpickle.loads(answer["snapshot"]) == {"pe": {"sink": {"n": 1}}} and answer["stopped"] == ["pe"]


def test_each_part_is_freed_in_the_pickling_thread_and_the_next_is_packed_while_one_is_delivered():
    """A move's parts are let go one by one, each in the thread that pickled it: their containers
    (a taken group's copy of its keys) are never freed on the worker's loop. Kept to the move's
    end, every part was freed at once there, as its last send returned: at 10^7 keys on memory a
    Release asked as a Replicate's move ended waited about 100 ms for that loop. And the next
    part is packed while the last one is delivered (and imported there), one part ahead at
    most: on the code before, part 1 was pickled only once part 0's delivery had returned, so
    the delivery of part 0 below waited in vain for it (both workers took turns being idle)."""
    freed: list[tuple[int, str]] = []
    second_packed = threading.Event()

    class Traced:                               # a part's state: where and when it was freed
        def __init__(self, n: int) -> None:
            self.n = n

        def __reduce__(self):
            return int, (self.n,)

        def __del__(self):
            freed.append((self.n, threading.current_thread().name))
            if self.n == 1:
                second_packed.set()

    async def scenario() -> list:
        sent = []

        class Peer:
            async def pe_handover_put(self, deployment, move, blob):
                n = cloudpickle.loads(blob)["state"]
                overlapped = await asyncio.to_thread(second_packed.wait, 10) if n == 0 else None
                sent.append((n, [m for m, _thread in freed], overlapped))

        here = HandOvers(lambda dep: {}, lambda address: Peer(), lambda: "tcp://a")
        moves = [{"tag": "m", "dst_worker": "tcp://b", "dst_pe": "copy"} for _ in range(3)]
        parts = [(m, {"state": Traced(i)}) for i, m in enumerate(moves)]
        await here._send_later("d", parts)
        return sent

    loop_thread = threading.current_thread().name
    sent = asyncio.run(scenario())
    assert [n for n, _seen, _o in sent] == [0, 1, 2]
    assert sent[0][2] is True, "part 1 was not packed while part 0 was delivered"
    for n, seen, _o in sent:                    # each freed before it went, at most one part beyond it
        assert n in seen and set(seen) <= set(range(n + 2)), sent
    assert [n for n, _thread in freed] == [0, 1, 2]
    assert all(thread != loop_thread for _n, thread in freed), freed


def test_a_failed_delivery_fails_the_move_and_the_part_packed_ahead_goes_unsent():
    """A delivery that raises ends the move (its gates stay pending; the wait says why) and the
    part packed meanwhile is not sent."""
    async def scenario():
        sent = []

        class Peer:
            async def pe_handover_put(self, deployment, move, blob):
                sent.append(cloudpickle.loads(blob)["state"])
                raise ConnectionError("the worker went away")

        here = HandOvers(lambda dep: {}, lambda address: Peer(), lambda: "tcp://a")
        moves = [{"tag": "m", "dst_worker": "tcp://b", "dst_pe": "copy"} for _ in range(3)]
        await here._send_later("d", [(m, {"state": i}) for i, m in enumerate(moves)])
        return sent, here.failed
    sent, failed = asyncio.run(scenario())
    assert sent == [0]
    assert "the worker went away" in failed[("d", "m")], failed

def test_the_parts_not_packed_yet_go_in_the_order_the_receiver_waits_for_their_groups():
    """Each import answers the groups tuples wait for there (most first); the parts not packed yet
    are sent in that order, the others in group order. On the code before, the parts went in
    group order whatever waited: a hot key's group could be the last of a long move."""
    async def scenario():
        sent = []

        class Peer:
            async def pe_handover_put(self, deployment, move, blob):
                part = cloudpickle.loads(blob)
                sent.append(part["groups"][0])
                return {"wanted": [13, 9] if len(sent) == 1 else []}      # after the first part

        here = HandOvers(lambda dep: {}, lambda address: Peer(), lambda: "tcp://a")
        move = {"tag": "m", "dst_worker": "tcp://b", "dst_pe": "copy", "dst": "w"}
        parts = [(move, {"state": None, "groups": list(range(g, g + 4))}) for g in range(0, 20, 4)]
        await here._send_later("d", parts)
        return sent
    # part 4 (packed ahead while part 0 went) as it is; then 12-15 (13), 8-11 (9), then 16-19
    assert asyncio.run(scenario()) == [0, 4, 12, 8, 16]


def test_an_import_answers_the_groups_of_its_move_that_tuples_wait_for_there():
    gate = SimpleNamespace(tag="m", waited_for=lambda: [7, 3])
    pe = SimpleNamespace(rewirer=SimpleNamespace(pending={"w": gate}))
    here = HandOvers(lambda dep: {"copy": pe}, lambda address: None, lambda: "tcp://a")
    assert here.wanted("d", "m", "copy", "w") == [7, 3]
    assert here.wanted("d", "other", "copy", "w") == [] and here.wanted("d", "m", "gone", "w") == []
