"""A Release's copy overdraws its channels into consumers that take its marker after the pause.

The pause waits until the copy's marker is queued at the consumer (``protocol._late_seen``). On
credit, the marker is queued only once the consumer took the credit window the copy had shipped
and freed credit for all the copy still buffered: up to two credit windows more, the backlog of
a full channel (flow.py). A window's copy into a slow consumer paused a Release for 10.2 s (six
busy loops: ``drain ... queued`` 10,151 ms of it). Now those channels overdraw from the pause on
(``CreditGate.overdraw``): the backlog, what the copy still emits and the marker go to the
consumer's inbox at once, and the consumer works them off after the pause.
"""

from __future__ import annotations

import asyncio

from test_held_watermarks import _kinds, full_upstream
from test_marker_overtakes import _placed

from pescheduler.actions import Release, Replicate
from pescheduler.control.protocol import plan_reconfiguration
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import channel_ids
from pescheduler.worker.channels import DATA, MARKER


def test_an_overdrawn_pe_takes_its_input_to_the_marker_and_ships_it_all_without_credit():
    async def scenario():
        pe, inboxes = await full_upstream()
        assert pe.inputs.full == {"tag"}
        src = pe.ports.receivers["c-src"]
        pe.ports.inbox.put(src, DATA, [{"n": 60, "ts": 60}])
        pe.ports.inbox.put(src, MARKER, "m1")
        await pe.align("m1", overdraw=["c-w", "c-copy"])
        for _ in range(3):                     # no credit is ever granted
            await pe.inputs.flush()
            pe.inputs.take()
            await pe.inputs.flush()
        assert not pe.ports.inbox.items, "the marker still waits behind input the PE would not take"
        assert pe.alignment_status("m1")["missing"] == []
        shipped = sorted(n for inbox in inboxes.values() for kind, p in _kinds(inbox) if kind == DATA for n in p)
        assert shipped == list(range(61)), "a batch still waits for credit"
        assert all(_kinds(inbox)[-1] == (MARKER, "m1") for inbox in inboxes.values())
    asyncio.run(scenario())


def test_without_overdrawing_the_full_pe_leaves_the_marker_in_its_inbox():
    async def scenario():
        pe, inboxes = await full_upstream()
        src = pe.ports.receivers["c-src"]
        pe.ports.inbox.put(src, MARKER, "m1")
        await pe.align("m1")
        await pe.inputs.flush()
        pe.inputs.take()
        assert pe.ports.inbox.items and pe.alignment_status("m1")["missing"] == ["aligned"]
        assert all((MARKER, "m1") not in _kinds(inbox) for inbox in inboxes.values())
    asyncio.run(scenario())


def test_a_released_copy_overdraws_exactly_its_channels_into_consumers_that_take_its_marker_late():
    old, channels = _placed()
    keyed = next(op for op in old.plan.ops if op.startswith("running_sum"))
    copied = transform(old, Replicate(keyed, 1))
    copied_channels = channel_ids(copied, "d", 1)
    plan = plan_reconfiguration(copied, transform(copied, Release(keyed, 1)), copied_channels, "d", 2)
    copy_pe = copied.pe_of(f"{keyed}#1")
    assert plan.late_seen, plan
    late = sorted(c for cs in plan.late_seen.values() for c in cs)
    assert plan.overdraw == {copy_pe: late}
    assert all(copied.pe_of(src) == copy_pe for (src, _p, _d), cid in copied_channels.items() if cid in late)
    # A Replicate retires nothing: nothing overdraws.
    assert plan_reconfiguration(old, copied, channels, "d", 1).overdraw == {}
