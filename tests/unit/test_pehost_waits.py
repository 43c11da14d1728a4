"""The PE host's waits (the drain's ``pe_reconf_wait``, the controller's ``pe_wait`` long poll,
``pe_ckpt_wait``) never miss a PE's change, whatever the other waits do meanwhile.

Issue 20: under CPU load a reconfiguration's drain sometimes waited out its whole timeout
(a ``Replicate`` paused 9 s) although every PE had aligned. All three waits shared one
``asyncio.Event`` that each cleared before looking: ``pe_reconf_wait`` looked, then
``asyncio.wait_for`` (Python 3.11) scheduled the wait as a task of its own; a PE aligned
(``set``) and the controller's next ``pe_wait`` arrived (``clear``) before that task ran, so the
set was wiped before anyone waited on it. A loaded worker runs a long batch of ready callbacks
per loop turn, which is where both land together. Here the same three steps run in that order.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from pescheduler.worker.aligner import Aligner
from pescheduler.worker.pehost import PEHost


def _host_with_one_pe():
    host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:1", handlers={}))
    pe = SimpleNamespace(aligner=Aligner(), state="running", error=None)
    pe.alignment_status = lambda marker, channel_ids=None: {     # the PE's control port, as far as a drain asks
        "missing": [] if pe.aligner.aligned else ["aligned"], "progress": 0, "times": {}}
    host.pes[("dep", "r")] = pe
    return host, pe


def test_a_pe_that_aligns_while_the_controller_polls_again_is_seen_at_once():
    async def scenario():
        host, pe = _host_with_one_pe()
        drain = asyncio.create_task(host.pe_reconf_wait("dep", "m", aligned=["r"], seen={}, timeout=5))
        await asyncio.sleep(0)                 # the drain looked: "r" has not aligned yet
        pe.aligner.aligned = True
        host._bump()                           # "r" aligns (PERunner.check_aligned -> on_change)
        poll = host.pe_wait("dep", host.version, timeout=5)    # the controller's next long poll
        poll.send(None)                        # starts in the same loop turn, before the drain waits
        try:
            answer = await asyncio.wait_for(drain, 1)
        finally:
            poll.close()
        assert answer["missing"] == [] and answer["failed"] == []
    asyncio.run(scenario())


def test_the_long_poll_returns_on_a_change_and_at_its_timeout_without_one():
    async def scenario():
        host, _pe = _host_with_one_pe()
        version = host.version
        poll = asyncio.create_task(host.pe_wait("dep", version, timeout=5))
        await asyncio.sleep(0)
        host._bump()
        answer = await asyncio.wait_for(poll, 1)
        assert answer["version"] == version + 1 and answer["pes"]["r"]["state"] == "running"
        quiet = await asyncio.wait_for(host.pe_wait("dep", host.version, timeout=0.05), 1)
        assert quiet["version"] == version + 1
    asyncio.run(scenario())


def test_a_rewire_waits_for_the_turn_running_in_the_pe_s_thread():
    """Issue 20, the per-key order race: under CPU load a PE's turns stretch past THREAD_AFTER_S
    and it moves to a thread; a rewire then ran on the event loop while the thread was still
    emitting, and a batch on the new route overtook the held ones re-sent ahead of it. Control
    calls that change a PE's routes or inputs wait for the turn in progress (Turns.lock)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import cloudpickle
    from test_held_watermarks import _upstream

    from pescheduler.wire import InputSpec

    async def scenario():
        host, _ = _host_with_one_pe()
        pe, _inboxes = await _upstream()
        host.pes[("dep", "up")] = pe
        pe.turns.bind()
        pe.turns.thread = ThreadPoolExecutor(1)
        started, finish = threading.Event(), threading.Event()

        def turn() -> bool:
            started.set()
            finish.wait(10)
            return True

        running = asyncio.create_task(pe.turns.run(turn))
        assert await asyncio.to_thread(started.wait, 10)
        rewire = asyncio.create_task(host.pe_rewire("dep", "up", add_inputs=cloudpickle.dumps(
            [InputSpec("c-new", "src", "out")])))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not rewire.done() and "c-new" not in pe.ports.receivers, "the rewire ran under the turn"
        finish.set()
        await asyncio.wait_for(asyncio.gather(running, rewire), 10)
        assert "c-new" in pe.ports.receivers
        pe.turns.thread.shutdown()
    asyncio.run(scenario())


def test_a_pause_asked_for_the_drain_answers_its_first_look():
    """``pe_reconf``'s ``drain``: the PEs begin the reconfiguration and the same call answers when
    they aligned (``pe_reconf_wait``'s answer), one round trip to this loop, not two (a Release at
    10^6 keys waited 8-41 ms for each). On main the argument did not exist."""
    async def scenario():
        host, pe = _host_with_one_pe()

        async def align(marker, release=False, carry=False, overdraw=()):
            pe.aligner.aligned = True
            host._bump()
        pe.align = align
        return await asyncio.wait_for(host.pe_reconf("dep", "m", hold={}, align=["r"],
                                                     drain={"aligned": ["r"], "seen": {}, "timeout": 5}), 2)
    answer = asyncio.run(scenario())
    assert answer["missing"] == [] and answer["failed"] == [], answer


def test_a_rewire_asked_to_expect_groups_gates_them_before_its_routers_switch():
    """``pe_rewire``'s ``expect``: the PE's instances gate the groups coming back
    (``HandOvers.pe_handover_expect``) in the same call, before the switch, so a Release's gate
    and switch are one round trip to this loop. On main the argument did not exist."""
    async def scenario():
        host, pe = _host_with_one_pe()
        done = []

        async def expect(deployment, moves):
            done.append(("gate", deployment, [m["groups"] for m in moves]))

        async def rewire(*args, before=lambda: None):
            before()
            done.append(("switch",))
        host.handovers.pe_handover_expect = expect
        pe.rewire, pe.opening = rewire, lambda: False
        await asyncio.wait_for(host.pe_rewire("dep", "r", remove_outputs=["c"], expect=[{"groups": [3, 4]}]), 2)
        return done
    assert asyncio.run(scenario()) == [("gate", "dep", [[3, 4]]), ("switch",)]


def test_a_checkpoints_end_leaves_the_loop_free_while_the_writer_ends_it():
    """The writer's end of a checkpoint (its chains confirmed, this worker's local copies pruned:
    70-123 ms at 10^7 keys) runs off the loop: a callback scheduled meanwhile runs before it is
    over, and the end is still over before ``pe_ckpt_end`` returns (commits follow it)."""
    import threading

    async def scenario():
        host, _pe = _host_with_one_pe()
        host.pes.clear()
        ran, order = threading.Event(), []

        def settle(deployment, checkpoint_id, complete):
            loop.call_soon_threadsafe(ran.set)  # runs only while the loop is free
            order.append(("end", ran.wait(5)))
            return lambda: None

        host.ckpt_files = SimpleNamespace(settle=settle)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(host.pe_ckpt_end("dep", 1, complete=True), 10)
        order.append("returned")
        assert order == [("end", True), "returned"], order
    asyncio.run(scenario())


def test_a_checkpoints_end_is_answered_before_what_it_let_go_of_is_freed():
    """After a fill of 10^7 keys on ``disk``, freeing the keys of a checkpoint's interval (a
    slice at a time, giving way to the PE) took 1-3 s, and the deploying process's call that ends
    the checkpoint timed out after 3 s (``pescheduler.calls.worker``). The sinks' commit and the
    answer wait for nothing of it: the freeing runs after, in a thread."""
    import threading

    async def scenario():
        host, _pe = _host_with_one_pe()
        host.pes.clear()
        go, freed = threading.Event(), threading.Event()

        def free() -> None:
            go.wait(10)
            freed.set()

        def settle(deployment, checkpoint_id, complete):
            return free

        host.ckpt_files = SimpleNamespace(settle=settle, end=lambda *args: settle(*args)())
        await asyncio.wait_for(host.pe_ckpt_end("dep", 1, complete=True), 5)
        assert not freed.is_set()
        go.set()
        assert await asyncio.to_thread(freed.wait, 10), "what the checkpoint let go of was never freed"

        freed.clear()                       # a sink's commit that raises: the call says so, and still frees

        async def commit(*args, **kwargs):
            raise RuntimeError("the sink's commit failed")
        host.pes[("dep", "r")] = SimpleNamespace(commit=commit)
        try:
            await asyncio.wait_for(host.pe_ckpt_end("dep", 2, complete=True), 5)
        except RuntimeError as exc:
            assert "commit failed" in str(exc)
        else:
            raise AssertionError("a commit that raised was not reported")
        assert await asyncio.to_thread(freed.wait, 10), "a commit that raised left what was let go of unfreed"
    asyncio.run(scenario())


def test_the_pause_call_says_when_each_pe_here_held_its_channels():
    """The pause's answer (``pe_reconf`` with the drain's first look) carries, beside the times the
    PEs aligned and took the marker, when each PE holding channels here sent it: the record's
    steps then split a drain's wait into before and after the marker left (a Release at 10^7 keys
    paused 81-193 ms in its drain, not broken down further)."""
    import time

    async def scenario():
        host, pe = _host_with_one_pe()
        took = []

        async def hold(channel_ids, marker, overtake=()) -> None:
            await asyncio.sleep(0.01)           # waits for the PE's turn
            took.append(time.time())

        pe.hold = hold
        before = time.time()
        pe.aligner.aligned = True
        answer = await asyncio.wait_for(host.pe_reconf(
            "dep", "m", hold={"r": ["c"]}, align=[], drain={"aligned": ["r"], "seen": {}, "timeout": 1}), 5)
        assert answer["missing"] == []
        assert before <= took[0] <= answer["times"]["r held"] <= time.time(), answer["times"]
    asyncio.run(scenario())
