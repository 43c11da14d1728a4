"""A reconfiguration holds a channel: the watermark of the operator feeding it waits too.

Issue 20 / test_copies: a MERGEABLE window emitted one window twice under
load. The upstream PE routes batches to the window (``w``) and its copy
(``w#1``). Releasing the copy holds the channel into it; the batches routed
there wait to be re-sent to ``w``. Had the upstream's watermark gone on along
the channel to ``w`` meanwhile, ``w`` (whose input from the copy is gone once
rewired) fires the window, then absorbs the re-sent batch and fires it again.
Here the same steps run deterministically on a real PE runner with in-memory
channels: no watermark may reach ``w`` ahead of data that was held for the copy.
"""

from __future__ import annotations

import asyncio

from support_ops import Tag

from pescheduler.wire import RouterTargets
from pescheduler.worker.channels import DATA, END, MARKER, WATERMARK, ChannelIn, Inbox
from pescheduler.worker.runtime import Hosting, PERunner
from pescheduler.wire import InputSpec, OutputSpec, PESpec

HERE = "127.0.0.1:1"
BOTH = {("tag", "out", "w"): (RouterTargets(("w", "w#1"), (1, 1)), None)}
ORIGINAL_ONLY = {("tag", "out", "w"): (RouterTargets(("w",), (1,)), None)}


async def _upstream():
    """PE ``up`` runs ``tag`` (fed by channel ``c-src``) and routes to ``w`` (c-w) and ``w#1`` (c-copy)."""
    outs = [OutputSpec("c-w", "tag", "out", "pe-w", "tcp://w", HERE, ("w",)),
            OutputSpec("c-copy", "tag", "out", "pe-copy", "tcp://w", HERE, ("w#1",))]
    spec = PESpec("up", "dep", {"tag": (Tag, {}, None)}, [("src", "out", "tag")],
                  inputs=[InputSpec("c-src", "src", "out")], outputs=outs, routing=BOTH, copies={"w#1": "w"})
    pe = PERunner(spec, Hosting("tcp://up"))
    inboxes = {"c-w": Inbox(), "c-copy": Inbox()}
    await pe.connect(lambda cid: (inboxes[cid], ChannelIn(cid, "tag", "out")), HERE)
    return pe, inboxes


async def full_upstream():
    """:func:`_upstream` out of credit on both outputs after taking 60 batches: ``tag``'s channels
    are full (flow.py), so the PE takes no more input that feeds them."""
    pe, inboxes = await _upstream()
    for _spec, out in pe.ports.outs:
        out.gate.credits = 0
    src = pe.ports.receivers["c-src"]
    for n in range(60):
        pe.ports.inbox.put(src, DATA, [{"n": n, "ts": n}])
    while pe.ports.inbox.items:
        pe.inputs.take()
    await pe.inputs.flush()
    return pe, inboxes


async def rewire_outputs(pe, outputs: list, remove: list[str], receivers, routing, copies) -> None:
    """The PE host's rewire of ``pe``'s outputs (new channels to ``receivers`` on this worker),
    through the PE's control port."""
    await pe.rewire(outputs, remove, [], [], None, routing, copies, (receivers, HERE, None), lambda _part: None)


async def _flush(pe):
    for _spec, channel in pe.ports.outs:
        await channel.flush(wait=False)


def _kinds(inbox):
    return [(kind, payload if kind != DATA else [t["n"] for t in payload]) for _c, kind, payload in inbox.items]


def test_a_held_channel_holds_back_the_watermark_until_its_data_is_re_sent():
    async def scenario():
        pe, inboxes = await _upstream()
        chain = pe.chain
        chain.emit_from("src", [{"n": 1, "ts": 100}])          # smooth round robin: w
        chain.emit_from("src", [{"n": 2, "ts": 200}])          # w#1
        pe.rewirer.hold(["c-copy"], "m1")                              # Release(w, 1) begins
        chain.emit_from("src", [{"n": 3, "ts": 300}])          # w
        chain.emit_from("src", [{"n": 4, "ts": 400}])          # w#1: held, to be re-sent to w
        chain.watermark_from("src", 1999)                      # would close w's [0, 2000) window
        chain.end_from("src")
        await _flush(pe)
        assert _kinds(inboxes["c-copy"]) == [(DATA, [2]), (MARKER, "m1")]
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (DATA, [3])], "nothing after the data yet"
        await rewire_outputs(pe, [], ["c-copy"], lambda cid: (_ for _ in ()).throw(KeyError(cid)),
                             ORIGINAL_ONLY, {"w#1": "w"})
        await _flush(pe)
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (DATA, [3]), (DATA, [4]), (WATERMARK, 1999), (END, None)]
        assert not chain.frozen
    asyncio.run(scenario())


def test_without_a_hold_watermarks_and_end_go_at_once():
    async def scenario():
        pe, inboxes = await _upstream()
        pe.chain.emit_from("src", [{"n": 1, "ts": 100}])
        pe.chain.watermark_from("src", 50)
        await _flush(pe)
        assert _kinds(inboxes["c-w"]) == [(DATA, [1]), (WATERMARK, 50)]
        assert _kinds(inboxes["c-copy"]) == [(WATERMARK, 50)]
    asyncio.run(scenario())


def test_a_held_channel_is_never_full_however_much_waits_behind_the_hold():
    """flow.py: a full channel makes the PE hold back the inputs feeding it. A held channel waits
    for the rewire, not for credit: counting it full would stop the PE taking the inputs that
    carry other channels' markers, so it never is (an unheld channel out of credit is)."""
    async def scenario():
        pe, inboxes = await _upstream()
        credits = pe.spec.credits
        pe.rewirer.hold(["c-copy"], "m1")
        pe.ports.outs[0][1].gate.credits = 10 ** 6                  # c-w is taken as fast as it comes
        for n in range(8 * credits):                          # half of them to the held copy
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
        await pe.inputs.flush()
        assert pe.inputs.full == frozenset() and pe.ports.outs[1][1].held
        pe.ports.outs[0][1].gate.credits = 0
        for n in range(6 * credits):                          # c-w: out of credit, backlog grows
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
        await pe.inputs.flush()
        assert pe.inputs.full == frozenset({"tag"})
    asyncio.run(scenario())
