"""A rescale off the pause, the worker's part: the gaining instance runs before the moving key
groups' state is in, holds those groups' tuples (and its watermark) until each group's import,
then processes them in arrival order; the old and new owners' outputs together are exactly a
single instance's (pescheduler/worker/pending_groups.py, handover.py)."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

import cloudpickle
import pytest

from pescheduler import MIN_WATERMARK, OperatorContext
from pescheduler.testing import CollectingOutput, RunResult, run_operators
from pescheduler.state.groups import PackedOnPickle
from pescheduler.wire import KEY_GROUPS, key_group
from pescheduler.worker.chain import Chain
from pescheduler.worker import handover
from pescheduler.worker.handover import HandOvers, exported, import_groups
from pescheduler.worker.pending_groups import HANDOVER_INPUT, PendingGroups
from pescheduler.worker.routing import key_function

from operators.count_window import CountWindow
from operators.session import SessionWindow
from support_ops import RunningSum

KEYS, N, STEP = 60, 6000, 500
MOVING = frozenset(range(0, KEY_GROUPS, 2))


def _tuples(lo, hi, keep=lambda t: True):
    return [t for t in ({"key": f"k{i % KEYS}", "n": i, "ts": i} for i in range(lo, hi)) if keep(t)]


def _moving(t) -> bool:
    return key_group(t["key"]) in MOVING


def _window():
    return CountWindow(count=7, aggregates={"total": ("sum", "n")}, key="key")


def _session():
    return SessionWindow(gap=3 * KEYS, aggregates={"total": ("sum", "n")}, key="key")


def _instance(make):
    """One instance of ``make()`` in a chain fed by an upstream operator ``src`` of another PE."""
    op, result = make(), RunResult()
    chain = Chain({"w": op}, [("src", "out", "w")], {("w", "out"): [CollectingOutput(result)]})
    op.open(OperatorContext(op_id="w", pe_id="t", key_field="key", extra={"inputs": ["src"]}))
    return SimpleNamespace(ops={"w": op}, chain=chain, result=result, rewirer=SimpleNamespace(pending={}, carried=None), pe_id="t",
                           state="running",
                           turns=SimpleNamespace(lock=asyncio.Lock()), ports=SimpleNamespace(wake=lambda: None),
                           spec=SimpleNamespace(ops={"w": (type(op), {}, "key")}, deployment="t"),
                           hosting=SimpleNamespace(state_backend="memory"))


def _feed(pe, tuples, end=False):
    for i in range(0, len(tuples), STEP):
        batch = tuples[i:i + STEP]
        pe.chain.emit_from("src", batch)
        pe.chain.watermark_from("src", batch[-1]["ts"] - 1)
    if end:
        pe.chain.end_from("src")


def _rows(result):
    return sorted((r["key"], r["window_start"], r["window_end"], r["total"]) for r in result.output)


def _reference(make):
    return _rows(run_operators(_tuples(0, N), make(), key_field="key", max_delay=0))


def _handed_over_live(make, rewired=False):
    """The old owner runs the first half, exports MOVING, runs the second half of the rest; the new
    owner, gated on MOVING, takes the second half of MOVING before the state is in (``rewired``:
    its chain's edges are installed again meanwhile, as a rewire of its PE's inputs does)."""
    old, new = _instance(make), _instance(make)
    _feed(old, _tuples(0, N // 2))
    parts = exported(old, {"src": "w", "groups": sorted(MOVING)})
    gate = PendingGroups(new.chain, "w", MOVING, key_function("key"), "m", fresh=True)
    _feed(new, _tuples(N // 2, N, _moving))
    if rewired:
        new.chain.set_edges(list(new.chain.edges), initial_wm=MIN_WATERMARK)
    held = (gate.buffered, new.chain.nodes["w"].wm, list(new.result.output))
    first = True
    for part in cloudpickle.loads(cloudpickle.dumps(parts)):
        if first:
            new.ops["w"].restore(part["state"])
            first = False
        else:
            new.ops["w"].import_groups(part["state"])
        gate.arrived(part["groups"])
    _feed(old, _tuples(N // 2, N, lambda t: not _moving(t)), end=True)
    new.chain.end_from("src")
    return held, gate, _rows(old.result) + _rows(new.result)


@pytest.mark.parametrize("rewired", [False, True], ids=["as_built", "rewired_while_gated"])
def test_tuples_of_a_group_not_arrived_wait_and_follow_its_import_exactly(rewired):
    """``rewired_while_gated``: a Release's original gates the groups its copy sends, and the PE
    downstream of the copy, its own, removes the copy's input (``Rewirer.set_inputs``:
    ``Chain.set_edges``) while the groups are still arriving: the watermark stays held, so the
    held tuples are not late once their state is in. Before, ``set_edges`` dropped the gate's
    input and moved the watermark to the source's: under load (a slow import), an over window's
    and a pattern's rows of the moving groups were lost (test_keyed_backend_copies,
    test_ep_state_copies)."""
    (buffered, wm, emitted), gate, rows = _handed_over_live(_window, rewired)
    assert buffered == len(_tuples(N // 2, N, _moving))       # every tuple of a moving group waited
    assert wm == MIN_WATERMARK and emitted == [], "the rewire moved the gated instance's watermark"
    assert gate.done and HANDOVER_INPUT not in gate.chain.nodes["w"].in_wm
    assert len(exported(_instance(_window), {"src": "w", "groups": sorted(MOVING)})) > 1   # sliced
    assert sorted(rows) == _reference(_window)


def test_a_session_window_handed_over_live_is_exact():
    _held, _gate, rows = _handed_over_live(_session)
    assert sorted(rows) == _reference(_session)


class _OrderOfInputs(RunningSum):
    """A keyed two-input operator each of whose rows depends on the order its key's tuples came
    in across both inputs (no ``export_groups``: the hand-over's snapshot-and-split path)."""

    name = "order_of_inputs"

    def process_input(self, k, batch, emit):
        key = self.context.key_field
        for t in batch:
            s = (self.sums.get(t[key], 0) * 3 + 7 * k + t["n"]) % 1_000_003
            self.sums[t[key]] = s
            emit({"key": t[key], "input": k, "n": t["n"], "s": s})


def _asof():
    from operators.join_asof import AsofJoin
    return AsofJoin(by="key")


def _two_inputs(make):
    """One instance of ``make()`` reading two upstream operators ``l`` and ``r`` of another PE."""
    op, result = make(), RunResult()
    chain = Chain({"w": op}, [("l", "out", "w"), ("r", "out", "w")], {("w", "out"): [CollectingOutput(result)]})
    op.open(OperatorContext(op_id="w", pe_id="t", key_field="key", extra={"inputs": ["l", "r"]}))
    return SimpleNamespace(ops={"w": op}, chain=chain, result=result, rewirer=SimpleNamespace(pending={}, carried=None))


def _feed_both(pe, lo, hi, keep=lambda t: True, end=False):
    """Batches of both inputs in turn (the right side's ``n`` offset), each input's watermark after."""
    for i in range(lo, hi, STEP):
        left = _tuples(i, min(i + STEP, hi), keep)
        right = [dict(t, n=t["n"] + 10**6) for t in left]
        if left:
            pe.chain.emit_from("l", left)
            pe.chain.emit_from("r", right)
        for side in ("l", "r"):
            pe.chain.watermark_from(side, min(i + STEP, hi) - 2)
    if end:
        pe.chain.end_from("l")
        pe.chain.end_from("r")


@pytest.mark.parametrize("make", [_OrderOfInputs, _asof], ids=["order_of_inputs", "join_asof"])
def test_a_two_input_operators_pending_groups_wait_with_their_input_and_replay_in_order(make):
    """A gated instance of an operator that reads two inputs (``process_input``) holds a pending
    group's tuples from both, with the input each came on, and replays them in arrival order
    across the inputs: the old and new owners' rows are exactly a single instance's (the
    order-dependent operator's rows say the order was kept). Before, the gate only took
    ``process``: such an operator's tuples went into the new instance before their state, so
    its moves had to be blocking (plan/state.py's ``_gateable``)."""
    def rows(result):
        return sorted(map(repr, result.output))

    reference = _two_inputs(make)
    _feed_both(reference, 0, N, end=True)
    old, new = _two_inputs(make), _two_inputs(make)
    _feed_both(old, 0, N // 2)
    parts = exported(old, {"src": "w", "groups": sorted(MOVING)})
    gate = PendingGroups(new.chain, "w", MOVING, key_function("key"), "m", fresh=True)
    _feed_both(new, N // 2, N, _moving)
    assert gate.buffered == 2 * len(_tuples(N // 2, N, _moving)), gate.figures()
    assert new.result.output == [] and new.chain.nodes["w"].wm == MIN_WATERMARK
    for i, part in enumerate(cloudpickle.loads(cloudpickle.dumps(parts))):
        if i == 0:
            new.ops["w"].restore(part["state"])
        else:
            import_groups(new.ops["w"], part["state"])
        gate.arrived(part["groups"])
    assert gate.done and new.chain.nodes["w"].process_input.__self__ is new.ops["w"]   # the gate is gone
    _feed_both(old, N // 2, N, lambda t: not _moving(t), end=True)
    new.chain.end_from("l")
    new.chain.end_from("r")
    assert sorted(rows(old.result) + rows(new.result)) == rows(reference.result)


def test_a_live_instance_gains_groups_whose_transfer_is_delayed():
    """Release's side: a running instance gates the groups a retired copy sends; the transfer is
    held back by an injected hook; tuples of those groups wait, the others are processed at once,
    and once the bytes arrive the wait answers the groups and bytes moved."""
    async def scenario():
        copy, original = _instance(_window), _instance(_window)
        _feed(copy, _tuples(0, N // 2, _moving))
        _feed(original, _tuples(0, N // 2, lambda t: not _moving(t)))
        here = HandOvers(lambda dep: {"orig": original}, None, lambda: "tcp://a")
        go_on = asyncio.Event()

        class Delayed:                          # the peer worker's RPC, held until go_on
            async def pe_handover_put(self, deployment, move, blob):
                await go_on.wait()
                await here.pe_handover_put(deployment, move, blob)
        there = HandOvers(lambda dep: {"copy": copy}, lambda address: Delayed(), lambda: "tcp://b")
        move = {"src": "w", "src_pe": "copy", "dst": "w", "dst_pe": "orig", "dst_worker": "tcp://a",
                "dst_live": True, "groups": sorted(MOVING), "tag": "m"}
        await here.pe_handover_expect("d", [move])
        answer = await there.pe_handover("d", [move])           # answers before any byte arrived
        assert answer == {"parts": len(MOVING) // 4}
        before = len(original.result.output)
        _feed(original, _tuples(N // 2, N))
        gate = original.rewirer.pending["w"]
        assert gate.buffered == len(_tuples(N // 2, N, _moving))
        # the groups it owned went on into the window, which waits for the watermark it holds
        assert len(original.ops["w"]._pending) >= len(_tuples(N // 2, N, lambda t: not _moving(t)))
        assert len(original.result.output) == before
        waiting = await here.pe_handover_wait("d", "m", timeout=0.05)
        assert waiting["pending"] == len(MOVING)
        go_on.set()
        done = await here.pe_handover_wait("d", "m", timeout=10)
        assert done["pending"] == 0 and done["bytes"] > 0 and not done["failed"]
        original.chain.end_from("src")
        return _rows(original.result) + _rows(copy.result)
    assert sorted(asyncio.run(scenario())) == _reference(_window)


def _given_to_the_original(prepare, events=None):
    """A Release's side through the workers' hand-over: the copy's MOVING groups to the running
    original, whose second half of the stream comes while they move. ``prepare(original)`` first;
    with ``events``, a task on the loop meanwhile appends ("loop", 0) to it once a pass (the loop's
    other callbacks: a source, a control call). Answers the hand-over's answer, its wait's, the
    original's gate and the rows of both instances."""
    async def scenario():
        copy, original = _instance(_window), _instance(_window)
        _feed(copy, _tuples(0, N // 2, _moving))
        _feed(original, _tuples(0, N // 2, lambda t: not _moving(t)))
        prepare(original)
        here = HandOvers(lambda dep: {"orig": original}, None, lambda: "tcp://a")
        there = HandOvers(lambda dep: {"copy": copy}, lambda address: here, lambda: "tcp://b")
        move = {"src": "w", "src_pe": "copy", "dst": "w", "dst_pe": "orig", "dst_worker": "tcp://a",
                "dst_live": True, "groups": sorted(MOVING), "tag": "m"}
        running = True

        async def other_work():
            while running:
                events.append(("loop", 0))
                await asyncio.sleep(0)
        beside = asyncio.create_task(other_work()) if events is not None else None
        await here.pe_handover_expect("d", [move])
        gate = original.rewirer.pending["w"]
        answer = await there.pe_handover("d", [move])
        _feed(original, _tuples(N // 2, N))
        done = await here.pe_handover_wait("d", "m", timeout=10)
        running = False
        if beside is not None:
            await beside
        original.chain.end_from("src")
        return answer, done, gate, _rows(original.result) + _rows(copy.result)
    return asyncio.run(scenario())


def _counting_imports(events, record):
    """``prepare`` for :func:`_given_to_the_original`: each import of the original's store noted."""
    def prepare(original):
        store = original.ops["w"]._keys
        plain = store.import_groups

        def import_groups(exported):
            events.append(record(exported))
            plain(exported)
        store.import_groups = import_groups
    return prepare


def test_a_deferred_part_is_unpacked_off_the_turn_and_installed_a_group_a_turn():
    """The gaining instance's turn only installs what came: each part is unpickled and its groups
    unpacked (made ready for the store: ``prepare_group``) in a thread, and each group goes in a
    turn of its own. At 10^7 keys a part of four groups unpacked in the turn held the PE 370-420 ms
    at a time after a Release (traced); a group is 1/128th of the state. Exactness as above."""
    from pescheduler.state.memory import PreparedGroup

    installs = []
    answer, done, _gate, rows = _given_to_the_original(_counting_imports(
        installs, lambda exported: {g: type(data).__name__ for g, data in exported.items()}))
    assert answer["parts"] > 1                       # parts of several groups each
    assert done["pending"] == 0 and not done["failed"]
    groups = [len(i) for i in installs if i]            # (a part's group with no key: only its waiting tuples)
    assert groups == [1] * len(groups) and len(groups) > 1
    assert {g for i in installs for g in i} <= MOVING
    assert {t for i in installs for t in i.values()} == {PreparedGroup.__name__}
    assert done["longest_import_s"] > 0
    assert sorted(rows) == _reference(_window)


def test_a_parts_groups_made_ready_off_the_turn_are_frozen_when_they_are_ready(monkeypatch, no_automatic_collection,
                                                                               freezing):
    """A part's groups are made ready for the store in a thread (a container or more per key) and
    live until their turns install them: frozen there once ready, no collection visits them. Left
    young, the first collection after, in that thread, visited them all holding the GIL: 40-95 ms
    after each part of a Replicate and of a Release at 10^7 keys on ``disk`` (traced); then a
    generation-1 collection and a full one again. Made with the collector held off (a PE batch's
    pause ending meanwhile does not turn it on: test_gc_pause.py)."""
    visited, on = [], []
    loads = handover.loads_prepared

    def loading(*args):
        on.append(gc.isenabled())
        return loads(*args)

    def record(exported):
        tracked = {id(o) for g in (0, 1, 2) for o in gc.get_objects(generation=g)}
        return [id(o) in tracked for prepared in exported.values() for o in (prepared, prepared.entries)]
    monkeypatch.setattr(handover, "loads_prepared", loading)
    answer, done, _gate, rows = _given_to_the_original(_counting_imports(visited, record))
    assert answer["parts"] > 1 and done["pending"] == 0 and not done["failed"]
    made = [v for part in visited for v in part]
    assert made and not any(made), f"{sum(made)} of {len(made)} objects made ready off the turn left to the collector"
    assert on and not any(on), "a part made ready with the collector on"
    assert sorted(rows) == _reference(_window)


def test_the_loop_runs_between_two_groups_of_a_part():
    """Each group of a part goes in a turn of its own, and the worker's loop runs between two of
    them (anything else on it: a source, a control call). The PE's lock, free, does not yield:
    a part's four groups, each with the tuples it held, went in back to back and stopped the
    loop 100-200 ms once a part at 10^7 keys on ``disk``, a source on that loop with it."""
    events = []
    answer, done, _gate, rows = _given_to_the_original(_counting_imports(events, lambda exported: ("install", 0)),
                                                       events)
    assert answer["parts"] < len(MOVING)              # parts of several groups each
    assert done["pending"] == 0 and not done["failed"]
    installs = [i for i, (kind, _n) in enumerate(events) if kind == "install"]
    assert len(installs) > answer["parts"]
    assert all(b - a > 1 for a, b in zip(installs, installs[1:])), "two groups went in back to back"
    assert sorted(rows) == _reference(_window)


def test_a_disk_store_gives_groups_away_without_reading_a_key_in_the_turn(tmp_path, monkeypatch):
    """The export in the PE's turn only takes the groups (a view, range deletes); their keys are
    read when the part is packed, off the turn, as they were at the take."""
    import dask.config

    import pescheduler.state.disk as disk
    from pescheduler.state import open_state, unpack_group

    with dask.config.set({"pescheduler.state.dir": str(tmp_path), "pescheduler.state.cache": "8MB"}):
        store = open_state("disk", owner="take")
    entries = {f"car-{i}": [i] for i in range(3000)}
    for k, v in entries.items():
        store.put(k, v)
    reads = []
    real = disk._range
    monkeypatch.setattr(disk, "_range", lambda source, group: reads.append(group) or real(source, group))
    moving = set(store.groups()[::2])
    g = min(moving)
    in_g = [k for k in entries if key_group(k) == g]
    store.put(in_g[0], ["written just before the take"])     # still in the write-back buffer
    store.delete(in_g[1])
    entries[in_g[0]] = ["written just before the take"]
    del entries[in_g[1]]
    taken = store.take_groups(moving)
    assert reads == [] and set(taken) == moving and not moving & set(store.groups())
    store.put(in_g[2], ["changed after the take"])
    mine = {k: v for k, v in entries.items() if key_group(k) == g}
    assert dict(taken[g].items()) == mine
    assert unpack_group(cloudpickle.loads(cloudpickle.dumps(PackedOnPickle(taken[g], g)))) == mine   # a raw part: its dict
    store.close()


def test_a_deferred_moves_parts_are_packed_and_sent_only_once_the_pause_is_over():
    """The exporting worker packs (which holds the GIL) and sends a deferred move's parts only
    after the controller's ``pe_handover_go``: inside the pause that work kept its loop from the
    calls the pause waits for (the new channels' connects, 1-3 s at 10^6 keys)."""
    async def scenario():
        copy, original = _instance(_window), _instance(_window)
        _feed(copy, _tuples(0, N // 2, _moving))
        _feed(original, _tuples(0, N // 2, lambda t: not _moving(t)))
        here = HandOvers(lambda dep: {"orig": original}, None, lambda: "tcp://a")
        sent = []

        class Peer:                             # the receiving worker's RPC, counting what came
            async def pe_handover_put(self, deployment, move, blob):
                sent.append(len(blob))
                await here.pe_handover_put(deployment, move, blob)
        there = HandOvers(lambda dep: {"copy": copy}, lambda address: Peer(), lambda: "tcp://b")
        move = {"src": "w", "src_pe": "copy", "dst": "w", "dst_pe": "orig", "dst_worker": "tcp://a",
                "dst_live": True, "groups": sorted(MOVING), "tag": "m", "go": 30}
        await here.pe_handover_expect("d", [move])
        await there.pe_handover("d", [move])
        _feed(original, _tuples(N // 2, N))     # the routers switched: all of the rest comes here
        waiting = await here.pe_handover_wait("d", "m", timeout=0.2)   # the pause goes on meanwhile
        assert sent == [] and waiting["pending"] == len(MOVING)
        await there.pe_handover_go("d", "m")
        done = await here.pe_handover_wait("d", "m", timeout=10)
        assert done["pending"] == 0 and sent and not done["failed"]
        original.chain.end_from("src")
        return _rows(original.result) + _rows(copy.result)
    assert sorted(asyncio.run(scenario())) == _reference(_window)


def test_an_instance_waiting_for_its_groups_holds_what_the_setting_allows_before_its_input_stops():
    """``pescheduler.state.hold`` (100,000 tuples), carried in every PE's spec, bounds what a gated
    instance holds, not a credit window (8,000 at the defaults): a Replicate's copy at 10^7 keys
    gets its groups over seconds, and past a credit window of their tuples its PE took no input
    and every tuple of the pipeline waited behind it (gaps of 0.4-4 s between outputs, traced)."""
    import dask

    from pescheduler import Application
    from pescheduler.plan.compiler import compile_app
    from pescheduler.plan.wiring import build_specs, channel_ids
    from pescheduler.plugins import load_plugins
    from pescheduler.worker.runtime import Hosting, PERunner

    app = Application("t")
    app.source("numbers").key_by("key").apply("running_sum").sink("print")
    info = {"tcp://a": {"host": "h", "data_address": "tcp://a:1"}}
    with dask.config.set({"pescheduler.state.hold": 50_000}):
        placement = compile_app(app, load_plugins(["support_ops"]), list(info))
        specs = build_specs(placement, info, "d", channel_ids(placement, "d", 0))
    spec = next(s for s in specs.values() if any("running_sum" in op for op in s.ops))
    assert spec.credits * spec.batch_size < 20_000 < 50_000
    pe = PERunner(spec, Hosting("tcp://a"))
    gate = SimpleNamespace(holding=20_000)
    pe.rewirer.pending["running_sum-3"] = gate
    assert pe.inputs.holds() == frozenset(), "an instance holding 20,000 tuples stopped its PE's input"
    gate.holding = 50_001
    assert pe.inputs.holds() == frozenset({"running_sum-3"})


def _sums(result):
    return sorted((r["key"], r["n"], r["sum"]) for r in result.output)


def test_a_released_copys_queued_input_goes_with_its_groups_and_through_the_gate_first():
    """A Release's copy, asked to align with ``carry`` (its groups all go to a gating original),
    processes no more of its input: the tuples queued ahead of the marker go with their key
    groups' parts, and the original puts them ahead of what its gate holds, so each key's running
    sums are a single instance's. The copy's drain is then no pass of its operator over its
    queued input (359-875 ms at 10^7 keys on disk, session 36)."""
    from pescheduler.worker.carried_input import carrying

    async def scenario():
        copy, original = _instance(RunningSum), _instance(RunningSum)
        first, queued, later = _tuples(0, N // 3), _tuples(N // 3, 2 * N // 3), _tuples(2 * N // 3, N)
        _feed(copy, [t for t in first if _moving(t)])
        _feed(original, [t for t in first if not _moving(t)])
        copy.rewirer.carried = carrying(copy.chain, copy.spec, {})
        assert copy.rewirer.carried is not None
        emitted = len(copy.result.output)
        _feed(copy, [t for t in queued if _moving(t)])              # its queue, ahead of the marker
        assert len(copy.result.output) == emitted, "the copy processed input it carries"
        _feed(original, [t for t in queued if not _moving(t)])
        here = HandOvers(lambda dep: {"orig": original}, None, lambda: "tcp://a")
        there = HandOvers(lambda dep: {"copy": copy}, lambda address: here, lambda: "tcp://b")
        move = {"src": "w", "src_pe": "copy", "dst": "w", "dst_pe": "orig", "dst_worker": "tcp://a",
                "dst_live": True, "groups": sorted(MOVING), "tag": "m"}
        await here.pe_handover_expect("d", [move])
        _feed(original, later)                  # the switch: the moving groups' later tuples wait
        await there.pe_handover("d", [move])
        done = await here.pe_handover_wait("d", "m", timeout=10)
        assert done["pending"] == 0 and not done["failed"], done
        assert done["carried"] == len([t for t in queued if _moving(t)]), done
        assert copy.rewirer.carried.left() == 0
        original.chain.end_from("src")
        return _sums(copy.result) + _sums(original.result)
    reference = _sums(run_operators(_tuples(0, N), RunningSum(), key_field="key", max_delay=0))
    assert sorted(asyncio.run(scenario())) == reference


def test_a_copy_still_waiting_for_groups_of_its_own_does_not_carry():
    """What it would carry could not be told from what its gate waits for: it drains as before
    (``carrying`` answers None, its operator untouched)."""
    from pescheduler.worker.carried_input import carrying

    copy = _instance(RunningSum)
    process = copy.chain.nodes["w"].process
    waiting = PendingGroups(copy.chain, "w", MOVING, key_function("key"), "m")
    assert carrying(copy.chain, copy.spec, {"w": waiting}) is None
    assert copy.chain.nodes["w"].process == waiting.process != process


def test_a_copy_that_carried_tuples_of_a_group_no_move_takes_fails_loudly():
    """Every tuple a copy carried leaves with a move's part; one of a group no move takes would be
    lost without a word: the hand-over fails instead (the reconfiguration fails, the run recovers)."""
    from pescheduler.worker.carried_input import carrying

    async def scenario():
        copy = _instance(RunningSum)
        copy.rewirer.carried = carrying(copy.chain, copy.spec, {})
        _feed(copy, _tuples(0, N // 3, _moving))
        some = sorted(MOVING)[:4]
        there = HandOvers(lambda dep: {"copy": copy}, lambda address: None, lambda: "tcp://b")
        move = {"src": "w", "src_pe": "copy", "dst": "w", "dst_pe": "orig", "dst_worker": "tcp://a",
                "dst_live": True, "groups": some, "tag": "m"}
        with pytest.raises(RuntimeError, match="gives to no one"):
            await there.pe_handover("d", [move])
    asyncio.run(scenario())


def test_the_groups_most_waited_for_come_first_and_each_tuples_wait_is_counted(monkeypatch):
    """``waited_for``: the pending groups tuples wait for, most first (what a move sends next and a
    lazy restore loads next); ``waited_s`` adds up each held tuple's wait, arrival to its group's
    import (the move's ``moving: mean wait of a tuple held ms``)."""
    clock = [100.0]
    monkeypatch.setattr("pescheduler.worker.pending_groups.time.perf_counter", lambda: clock[0])
    new = _instance(_window)
    keys = {}                                   # a key of each of three moving groups
    for i in range(10_000):
        keys.setdefault(key_group(f"k{i}"), f"k{i}")
    a, b, c = sorted(g for g in keys if g in MOVING)[:3]
    gate = PendingGroups(new.chain, "w", MOVING, key_function("key"), "m", fresh=True)
    assert gate.waited_for() == []
    batch = [{"key": keys[b], "n": 1, "ts": 1}] * 3 + [{"key": keys[a], "n": 1, "ts": 1}] * 3 + \
        [{"key": keys[c], "n": 1, "ts": 1}]
    new.chain.emit_from("src", batch)           # at 100 s: b and a hold 3 tuples each, c one
    assert gate.waited_for() == [a, b, c]       # most first, ties by group
    clock[0] = 101.0
    new.chain.emit_from("src", [{"key": keys[c], "n": 1, "ts": 2}] * 4)     # c: 5 tuples now
    assert gate.waited_for() == [c, a, b]
    clock[0] = 103.0
    gate.arrived([c])                           # c's tuples waited 3 s (one) and 2 s (four)
    assert gate.waited_s == pytest.approx(3 + 4 * 2)
    assert gate.waited_for() == [a, b] and gate.figures()["waited_s"] == pytest.approx(11)
