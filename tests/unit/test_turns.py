"""A PE's turns run on the event loop until one runs long, then in a thread of their own."""

from __future__ import annotations

import asyncio
import threading
import time

from pescheduler.worker.turns import BACK_AFTER_S, LONG_TURN_S, THREAD_AFTER_S, YIELDS, Turns, let_the_loop_run


def test_a_long_turn_moves_the_pe_to_its_thread_and_loop_work_is_handed_back():
    async def main():
        turns = Turns("pe-1", time_slice_s=0.01)
        turns.bind()
        loop_thread = threading.get_ident()
        ran_in = []

        def quick():
            ran_in.append(threading.get_ident())
            return True

        def slow():
            time.sleep(THREAD_AFTER_S * 1.5)
            return False

        assert await turns.run(quick) and turns.thread is None
        assert not await turns.run(slow) and turns.thread is not None
        assert turns.threaded_because.startswith("a turn took")
        called_on = asyncio.get_running_loop().create_future()

        def from_thread():
            ran_in.append(threading.get_ident())
            turns.on_loop(lambda: called_on.set_result(threading.get_ident()))
            return True

        assert await turns.run(from_thread)
        assert await asyncio.wait_for(called_on, 5) == loop_thread     # handed back to the loop
        assert ran_in[0] == loop_thread and ran_in[1] != loop_thread
        turns.close()

    asyncio.run(main())


def test_a_turn_is_timed_on_the_busy_clock_so_waiting_for_a_cpu_does_not_send_the_pe_to_a_thread(monkeypatch):
    """On a loaded machine a quick turn can wait 100s of ms for a CPU; the busy clock (busy.py)
    leaves that wait out, so the PE stays on the loop (a source went threaded at load 28 when
    turns were timed on wall time). The clock is stubbed: the decision follows it alone, a turn
    of 5 ms on it stays on the loop and one of 0.5 s on it (taking no wall time) goes to a thread,
    which wall-time timing would not do."""
    import pescheduler.worker.turns as turns_module

    readings = iter([10.0, 10.005, 20.0, 20.0 + THREAD_AFTER_S * 5])
    monkeypatch.setattr(turns_module, "busy_clock", lambda: next(readings))

    async def main():
        turns = Turns("pe-1", time_slice_s=0.01)
        turns.bind()
        assert await turns.run(lambda: True) and turns.thread is None and not turns.threaded_because
        assert await turns.run(lambda: True) and turns.thread is not None
        assert turns.threaded_because == f"a turn took {THREAD_AFTER_S * 5 * 1000:.0f} ms"
        turns.close()

    asyncio.run(main())


def test_a_pe_sent_to_its_thread_by_a_long_turn_comes_back_to_the_loop_after_short_turns(monkeypatch):
    """One long turn (a rescale's import, a flush under load) no longer keeps a PE off the loop
    for good: after BACK_AFTER_S of turns under half the threshold it runs on the loop again, a
    turn over half of it in the thread restarts that stretch, and each return doubles it. The
    busy clock and the wall clock are stubbed: each turn below is given its length on them."""
    import types

    import pescheduler.worker.turns as turns_module

    now = [100.0]
    monkeypatch.setattr(turns_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    busy = [0.0]
    long_s = THREAD_AFTER_S * 2                 # over the threshold (the slice's is lower)
    half_s = THREAD_AFTER_S * 0.6               # short of it, over half of it
    short_s = THREAD_AFTER_S * 0.1

    async def main():
        turns = Turns("pe-1", time_slice_s=0.01, clock=lambda: busy[0])
        turns.bind()
        loop_thread = threading.get_ident()
        ran_in = []

        async def turn(busy_s: float, wall_s: float) -> None:
            def work():
                ran_in.append(threading.get_ident())
                busy[0] += busy_s
                return True
            now[0] += wall_s
            assert await turns.run(work)

        await turn(long_s, 0.2)
        assert turns.thread is not None and ran_in[-1] == loop_thread
        await turn(short_s, BACK_AFTER_S * 0.6)
        await turn(half_s, 0.1)                 # restarts the short stretch
        await turn(short_s, BACK_AFTER_S * 0.6)
        assert turns.thread is not None and ran_in[-1] != loop_thread, "back before a whole short stretch"
        await turn(short_s, BACK_AFTER_S * 0.5)
        assert turns.thread is None and turns.threaded_because == ""
        await turn(short_s, 0.01)
        assert ran_in[-1] == loop_thread
        await turn(long_s, 0.2)                 # long again: threaded again, for twice the stretch
        assert turns.thread is not None and turns.threaded_because.startswith("a turn took")
        await turn(short_s, BACK_AFTER_S * 1.5)
        assert turns.thread is not None
        await turn(short_s, BACK_AFTER_S * 0.6)
        assert turns.thread is None
        turns.close()

    asyncio.run(main())


def test_a_pe_that_may_block_stays_in_its_thread_however_short_its_turns(monkeypatch):
    """The thread of a PE whose operator may wait on deliveries is not a long turn's: it stays."""
    import types

    import pescheduler.worker.turns as turns_module

    now = [100.0]
    monkeypatch.setattr(turns_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))

    async def main():
        turns = Turns("pe-1", time_slice_s=0.01, clock=lambda: 0.0)
        turns.bind()
        turns.go_threaded("jsonl-3 may wait on deliveries")
        for _ in range(3):
            now[0] += BACK_AFTER_S * 4
            assert await turns.run(lambda: True)
        assert turns.thread is not None and turns.threaded_because == "jsonl-3 may wait on deliveries"
        turns.close()

    asyncio.run(main())


def test_a_pe_that_may_block_works_off_the_loop_from_its_first_turn_and_its_commits_too():
    """A PE holding a sink that retries deliveries goes to its thread before any turn, and the
    control calls reaching its operators between turns (a commit) run there too: the loop ticks
    on while they wait."""
    async def main():
        turns = Turns("pe-1", time_slice_s=0.01)
        turns.bind()
        loop_thread = threading.get_ident()
        turns.go_threaded("jsonl-3 may wait on deliveries")
        assert turns.threaded_because == "jsonl-3 may wait on deliveries"
        ticks = []

        async def tick():
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())

        def commit():
            time.sleep(0.3)                       # a delivery retrying after a backoff
            return threading.get_ident()

        async with turns.lock:
            ran_in = await turns.off_loop(commit)
        ticker.cancel()
        assert ran_in != loop_thread
        assert len(ticks) >= 5, "the loop stood still while the commit waited"
        turns.close()

    asyncio.run(main())


def _turns_until(chain_links: int, between) -> int:
    """A hot PE's loop (each pass of the ``while`` is a turn) beside a chain of ``chain_links``
    callbacks, each scheduled by the one before, as a control call's or a handshake's are: how
    many turns ran before the chain's end."""
    async def main():
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def link(left: int) -> None:
            if left == 0:
                done.set()
            else:
                loop.call_soon(link, left - 1)
        loop.call_soon(link, chain_links)
        turns = 0
        while not done.is_set():
            turns += 1
            await between()
        return turns
    return asyncio.run(main())


def test_between_two_turns_a_chain_of_callbacks_runs_to_its_end():
    """One pass between turns (``asyncio.sleep(0)``, before) made each link of a chain wait for a
    whole turn of the PE: a copy's connect to a hot PE's worker took four turns, 80 of a warm
    activation's 100 ms. Now the loop runs until nothing else is ready."""
    assert _turns_until(4, let_the_loop_run) == 1
    assert _turns_until(4, lambda: asyncio.sleep(0)) == 5      # what one pass did


def test_a_callback_that_never_stops_rescheduling_itself_leaves_the_pe_its_turns():
    """The passes between turns are bounded (YIELDS): the PE is not starved by a busy loop."""
    async def main():
        loop = asyncio.get_running_loop()
        passes = 0

        def forever() -> None:
            nonlocal passes
            passes += 1
            loop.call_soon(forever)
        loop.call_soon(forever)
        await let_the_loop_run()
        return passes
    assert 1 <= asyncio.run(main()) <= YIELDS


def test_a_pe_lets_the_loop_run_its_chains_after_a_long_turn_and_passes_once_after_a_short_one():
    """``Turns.between``: after a turn that held the loop LONG_TURN_S or more, the loop's chains run
    to their end before the next turn; after a short one, one pass (two PEs of one worker with
    turns of microseconds would pass the loop to each other YIELDS times between turns)."""
    def turns_with(took: float) -> int:
        now = [0.0]

        def clock() -> float:           # the busy clock: each turn takes ``took`` of it
            return now[0]

        def work() -> bool:
            now[0] += took
            return True

        async def between() -> None:
            await turns.run(work)
            await turns.between()
        turns = Turns("pe-1", time_slice_s=0.01, clock=clock)
        return _turns_until(4, between)
    assert turns_with(LONG_TURN_S) == 1
    assert turns_with(LONG_TURN_S / 10) == 5


def test_calls_handed_to_the_loop_while_one_waits_go_with_it_in_order():
    """``on_loop`` from the PE's thread: one wake-up of the loop (a socket write, which lets the
    GIL go) for calls made while an earlier one still waits, not one per call (per batch: its
    credit); every call runs, in order, one failing does not stop the rest."""
    async def main():
        loop = asyncio.get_running_loop()
        turns = Turns("pe-1", time_slice_s=0.01)
        turns.bind()
        wakes, ran = [], []
        real = loop.call_soon_threadsafe

        def counted(fn, *args):
            wakes.append(fn)
            return real(fn, *args)
        loop.call_soon_threadsafe = counted

        def boom():
            raise RuntimeError("one call fails")
        loop.set_exception_handler(lambda _loop, context: ran.append("logged"))

        def from_thread():
            for i in range(50):
                turns.on_loop(lambda i=i: ran.append(i))
            turns.on_loop(boom)
            turns.on_loop(lambda: ran.append("last"))
        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join(5)                          # the loop is held meanwhile: every call waits for it
        done = loop.create_future()
        turns.on_loop(lambda: done.set_result(None))     # on the loop itself: at once
        await asyncio.wait_for(done, 5)
        for _ in range(10):
            await asyncio.sleep(0)
        return wakes, ran
    wakes, ran = asyncio.run(main())
    assert len(wakes) == 1, len(wakes)
    assert ran == list(range(50)) + ["logged", "last"], ran
