"""A reconfiguration that pauses waits until the checkpoint write in flight has ended.

Traced at 10^6 and 10^7 keys on memory (h32r): the checkpoint right after a Replicate writes the
moved key groups whole, and it was still writing through the next Release's pause. The write runs
after the coordinator released the Reconfigurer's lock, in a thread of each worker (the fold,
``pack_group``: 250-280 ms of Python each at 10^7), holding the GIL against the worker loops that
each of the pause's calls waits for. Now the write is marked (``Reconfigurer.writing``, around the
coordinator's write) and a pausing action waits for it before its pause, bounded.
"""

from __future__ import annotations

import asyncio

from pescheduler.actions import Release, Replicate
from pescheduler.control.reconfigurer import Reconfigurer
from pescheduler.control.state import DeploymentState
from pescheduler.plan.transforms import transform

from keyed_handover import WORKERS, placed_keyed_window
from test_handover import _Recording


class _Gateway(_Recording):
    async def launch(self, specs, placement):
        return []

    async def warm(self, per_worker):
        pass


def _release_beside_a_write(ends_write: bool):
    old, window = placed_keyed_window()
    two = transform(old, Replicate(window, 1))

    async def scenario():
        state, gateway = DeploymentState(), _Gateway()
        rec = Reconfigurer(gateway, state, "d", None, 2)
        rec.worker_info = {w: {"data_address": w, "host": w} for w in WORKERS}
        state.running(two.pes)
        await rec.launch(two, {})
        written, entered = asyncio.Event(), asyncio.Event()

        async def checkpoint_write():
            async with rec.writing():
                entered.set()
                await written.wait()
                gateway.calls.append(("write ended",))
        write = asyncio.create_task(checkpoint_write())
        await asyncio.wait_for(asyncio.wait({write, asyncio.ensure_future(entered.wait())},
                                            return_when=asyncio.FIRST_COMPLETED), 5)
        if write.done():
            write.result()                      # the write could not be marked: say why
        release = asyncio.create_task(rec.apply(Release(window, 1), timeout=0.5))
        for _ in range(20):                     # the Release planned and waits: no call asked
            await asyncio.sleep(0)
        asked = list(gateway.calls)
        if ends_write:
            written.set()
        record = await asyncio.wait_for(release, 5)
        written.set()
        await asyncio.wait_for(write, 5)
        return asked, gateway.calls, record
    return asyncio.run(scenario())


def test_a_release_pauses_only_once_the_checkpoint_write_in_flight_ended():
    """On main: ``AttributeError: 'Reconfigurer' object has no attribute 'writing'``."""
    asked, calls, record = _release_beside_a_write(ends_write=True)
    assert asked == [], f"the Release paused beside the write: {asked}"
    kinds = [c[0] for c in calls]
    assert kinds.index("write ended") < kinds.index("pause"), calls
    assert record.applied and "before the pause: checkpoint write" in record.steps, record.as_dict()


def test_a_write_that_does_not_end_holds_the_release_only_for_its_timeout():
    asked, calls, record = _release_beside_a_write(ends_write=False)
    kinds = [c[0] for c in calls]
    assert record.applied and kinds.index("pause") < kinds.index("write ended"), calls   # bounded
    assert "before the pause: checkpoint write" in record.steps, record.steps
