"""A holder's marker overtakes what its held channel buffers; the buffered data is re-sent on
the new route, in order, ahead of what was emitted after the hold (issue 20).

Under a saturated CPU a reconfiguration's marker waited behind each holder's backlog, one
credit window per round trip with the PE it feeds, and drains grew from 0.5 to 9 s. Where every
re-send target is a PE the reconfiguration creates (protocol._overtakable), the marker goes
first (Flink's unaligned checkpoints let a barrier overtake in-flight data the same way). Here
on a real PE runner with in-memory channels, and on the plans random transforms produce.
"""

from __future__ import annotations

import asyncio

from test_held_watermarks import HERE, ORIGINAL_ONLY, _flush, _kinds, _upstream, rewire_outputs

from pescheduler import Application
from pescheduler.actions import Fuse, Move, Release, Replicate
from pescheduler.control.protocol import plan_reconfiguration
from pescheduler.plan.compiler import compile_app
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import channel_ids
from pescheduler.plugins import load_plugins
from pescheduler.worker.channels import DATA, END, MARKER, WATERMARK, ChannelIn, Inbox
from pescheduler.wire import OutputSpec

NOWHERE = lambda cid: (_ for _ in ()).throw(KeyError(cid))     # noqa: E731  (no new local receiver)


def _backlog(pe):
    """Batches 1..8 alternate between w (c-w) and the copy (c-copy), both out of credit after
    one: 3, 5, 7 and 4, 6, 8 wait in the channels' buffers."""
    for _spec, out in pe.ports.outs:
        out.gate.credits = 1
    for n in range(1, 9):
        pe.chain.emit_from("src", [{"n": n, "ts": n}])


def test_the_marker_goes_ahead_of_the_held_backlog_which_follows_on_the_new_route_in_order():
    """Both instances replaced (a KEYED operator's copy released): the new PE gets, on its new
    channel, each old channel's backlog and what followed the hold, each in its order."""
    async def scenario():
        pe, inboxes = await _upstream()
        _backlog(pe)
        await _flush(pe)
        assert _kinds(inboxes["c-w"]) == [(DATA, [1])] and _kinds(inboxes["c-copy"]) == [(DATA, [2])]
        pe.rewirer.hold(["c-w", "c-copy"], "m1", overtake=["c-w", "c-copy"])
        pe.chain.emit_from("src", [{"n": 9, "ts": 9}])          # w: behind the hold
        pe.chain.emit_from("src", [{"n": 10, "ts": 10}])        # the copy: behind the hold
        await _flush(pe)
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (MARKER, "m1")], "no credit needed, no backlog ahead"
        assert _kinds(inboxes["c-copy"]) == [(DATA, [2]), (MARKER, "m1")]
        fresh = Inbox()
        await rewire_outputs(pe, [OutputSpec("c-new", "tag", "out", "pe-w2", "tcp://w", HERE, ("w",))],
                             ["c-w", "c-copy"], lambda cid: (fresh, ChannelIn(cid, "tag", "out")), ORIGINAL_ONLY,
                             {"w#1": "w"})
        await _flush(pe)
        assert [p for kind, p in _kinds(fresh) if kind == DATA] == [[3], [5], [7], [9], [4], [6], [8], [10]]
    asyncio.run(scenario())


def test_without_overtaking_the_marker_waits_behind_the_backlog():
    async def scenario():
        pe, inboxes = await _upstream()
        _backlog(pe)
        await _flush(pe)
        pe.rewirer.hold(["c-copy"], "m1")
        await _flush(pe)
        assert _kinds(inboxes["c-copy"]) == [(DATA, [2])], "the marker needs credit for three batches first"
        assert pe.ports.outs[1][1].data_pending() == 3
    asyncio.run(scenario())


def test_the_backlog_s_watermark_follows_every_re_sent_batch():
    """A watermark buffered in the backlog, re-sent where it stood, would go to the new PE ahead
    of the other held channel's backlog and make its batches late: it goes after all of them."""
    async def scenario():
        pe, _inboxes = await _upstream()
        _backlog(pe)
        pe.chain.watermark_from("src", 8)                      # behind 3, 5, 7 and 4, 6, 8
        await _flush(pe)
        pe.rewirer.hold(["c-w", "c-copy"], "m1", overtake=["c-w", "c-copy"])
        await _flush(pe)
        fresh = Inbox()
        await rewire_outputs(pe, [OutputSpec("c-new", "tag", "out", "pe-w2", "tcp://w", HERE, ("w",))],
                             ["c-w", "c-copy"], lambda cid: (fresh, ChannelIn(cid, "tag", "out")), ORIGINAL_ONLY,
                             {"w#1": "w"})
        await _flush(pe)
        assert _kinds(fresh) == [(DATA, [3]), (DATA, [5]), (DATA, [7]), (DATA, [4]), (DATA, [6]), (DATA, [8]),
                                 (WATERMARK, 8)]
    asyncio.run(scenario())


def test_a_channel_that_ended_keeps_its_order_and_carries_no_marker():
    async def scenario():
        pe, inboxes = await _upstream()
        _backlog(pe)
        pe.chain.end_from("src")                               # END buffered behind the backlog
        await _flush(pe)
        pe.rewirer.hold(["c-copy"], "m1", overtake=["c-copy"])
        pe.ports.outs[1][1].gate.credits = 100
        await _flush(pe)
        kinds = _kinds(inboxes["c-copy"])
        assert [p for k, p in kinds if k == DATA] == [[2], [4], [6], [8]] and kinds[-1] == (END, None)
        assert (MARKER, "m1") not in kinds
    asyncio.run(scenario())


WORKERS = ["tcp://a", "tcp://b", "tcp://c"]


def _placed():
    app = Application("t")
    keyed = app.source("numbers", count=10**9, keys=5).apply("tag").key_by("key")
    keyed.apply("running_sum").sink("collect")
    app.source("numbers", count=10**9).apply("window_count", size=1000).sink("collect")
    placement = compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})
    return placement, channel_ids(placement, "d", 0)


def _plan(old, channels, action):
    new = transform(old, action)
    return new, plan_reconfiguration(old, new, channels, "d", 1)


def test_a_marker_overtakes_only_where_every_re_send_target_is_created():
    old, channels = _placed()
    keyed = next(op for op in old.plan.ops if op.startswith("running_sum"))
    count = next(op for op in old.plan.ops if op.startswith("window_count"))
    # A KEYED operator gets a copy: its PE is replaced and the copy's created; the holder's backlog
    # is re-split by the new key-group owners, all in created PEs.
    new, plan = _plan(old, channels, Replicate(keyed, 1))
    held = {c for cs in plan.hold.values() for c in cs}
    assert held and {c for cs in plan.overtake.values() for c in cs} == held
    # A MERGEABLE copy is released and its original stays: what was held for the copy goes to a
    # PE that stays and may still have the old channel's data in flight, so no overtaking.
    copied = transform(old, Replicate(count, 1))
    plan = plan_reconfiguration(copied, transform(copied, Release(count, 1)), channel_ids(copied, "d", 1), "d", 2)
    assert plan.hold and plan.overtake == {}, (plan.hold, plan.overtake)
    # A moved PE is created anew: overtaking.
    middle = old.pe_of(keyed)
    _new, plan = _plan(old, channels, Move(middle, next(w for w in WORKERS if w != old.pes[middle].worker)))
    assert plan.overtake == plan.hold and plan.hold


def test_a_fanned_out_port_does_not_overtake():
    """One port feeding two consumers in two PEs: a batch shipped on one channel and overtaken on
    the other would be re-sent to a PE that runs both after a Fuse, and the first takes it twice."""
    app = Application("t")
    numbers = app.source("numbers", count=10**9)
    numbers.apply("tag").sink("collect")
    numbers.apply("tag").sink("collect")
    old = compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: w for w in WORKERS})
    channels = channel_ids(old, "d", 0)
    fed = [pe for pe in old.pes if any(key[2] == pe and key[0] == "numbers-1" for key in channels)]
    assert len(fed) == 2, old.pes
    _new, plan = _plan(old, channels, Fuse(*fed))
    assert plan.hold and plan.overtake == {}, (plan.hold, plan.overtake)
