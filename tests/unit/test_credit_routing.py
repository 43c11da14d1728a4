"""A STATELESS operator's instances share its input by credit, and a PE's inputs share its time.

Issue 15: with an even split in turn, the original of a hot operator on a
starved host limited every copy (the router waited for its credit), and the
PE that ran the original fused with the sink took the copies' output only
behind the original's whole credit window of expensive batches. Here the
same steps run deterministically on real PE runners with in-memory channels
(as test_held_watermarks does for a MERGEABLE router, whose rules stay).
"""

from __future__ import annotations

import asyncio
import time

from inbox import take_all
from support_ops import Tag

from pescheduler.operator import Operator
from pescheduler.wire import RouterTargets
from pescheduler.worker.channels import DATA, WATERMARK, ChannelIn, Inbox
from pescheduler.worker.flow import RELIEF_BATCHES
from pescheduler.worker.runtime import Hosting, PERunner
from pescheduler.wire import InputSpec, OutputSpec, PESpec

HERE = "127.0.0.1:1"
BY_CREDIT = {("tag", "out", "w"): (RouterTargets(("w", "w#1"), (1, 1), by_credit=True), None)}


async def _upstream():
    """PE ``up`` runs ``tag`` (fed by channel ``c-src``) and routes by credit to ``w`` (c-w) and
    its copy ``w#1`` (c-copy)."""
    outs = [OutputSpec("c-w", "tag", "out", "pe-w", "tcp://w", HERE, ("w",)),
            OutputSpec("c-copy", "tag", "out", "pe-copy", "tcp://w", HERE, ("w#1",))]
    spec = PESpec("up", "dep", {"tag": (Tag, {}, None)}, [("src", "out", "tag")],
                  inputs=[InputSpec("c-src", "src", "out")], outputs=outs, routing=BY_CREDIT,
                  copies={"w#1": "w"})
    pe = PERunner(spec, Hosting("tcp://up"))
    inboxes = {"c-w": Inbox(), "c-copy": Inbox()}
    await pe.connect(lambda cid: (inboxes[cid], ChannelIn(cid, "tag", "out")), HERE)
    return pe, inboxes, pe.ports.outs[0][1], pe.ports.outs[1][1]


def _data(inbox):
    return sum(1 for _c, kind, _p in inbox.items if kind == DATA)


def test_an_instance_out_of_credit_is_passed_over_and_holds_nothing_back_while_another_has_room():
    async def scenario():
        pe, inboxes, to_w, to_copy = await _upstream()
        credits = pe.spec.credits
        to_w.gate.credits = 0                                 # w's host is starved: no credit comes back
        to_copy.gate.credits = 10 ** 6                        # the copy's host takes all it gets
        for n in range(3 * RELIEF_BATCHES * credits):         # an even split would fill to_w
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
            await pe.inputs.flush()
        assert to_w.data_pending() == 0 and _data(inboxes["c-copy"]) == 3 * RELIEF_BATCHES * credits
        assert pe.inputs.full == frozenset(), "the copy takes batches: the source must not be held back"
        to_copy.gate.credits = 0
        for n in range(3 * RELIEF_BATCHES * credits):         # the copy out of credit too
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
        await pe.inputs.flush()
        assert to_w.full(RELIEF_BATCHES * credits) and to_copy.full(RELIEF_BATCHES * credits)
        assert pe.inputs.full == frozenset({"tag"}), "every instance is out of credit: now it is full"
    asyncio.run(scenario())


def test_a_held_instance_relieves_nothing_and_is_never_full_itself():
    """flow.py: a held channel waits for the rewire, not for credit, so it is never full; nor does
    it count as room for the others (what is routed there waits for the reconfiguration)."""
    async def scenario():
        pe, _inboxes, to_w, to_copy = await _upstream()
        credits = pe.spec.credits
        pe.rewirer.hold(["c-copy"], "m1")
        to_w.gate.credits = 10 ** 6
        for n in range(8 * credits):
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
        await pe.inputs.flush()
        assert pe.inputs.full == frozenset() and to_copy.held
        assert to_copy.data_pending() == 0, "with room elsewhere nothing waits behind the hold"
        to_w.gate.credits = 0
        for n in range(4 * RELIEF_BATCHES * credits):
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
        await pe.inputs.flush()
        assert not to_copy.full(RELIEF_BATCHES * credits)
        assert pe.inputs.full == frozenset({"tag"})
    asyncio.run(scenario())


def test_watermarks_reach_every_instance_even_one_that_got_no_batch():
    async def scenario():
        pe, inboxes, to_w, _to_copy = await _upstream()
        to_w.gate.credits = 0
        for n in range(3):
            pe.chain.emit_from("src", [{"n": n, "ts": n}])
        pe.chain.watermark_from("src", 50)
        await pe.inputs.flush()
        assert [k for _c, k, _p in inboxes["c-w"].items] == [WATERMARK]
        assert [k for _c, k, _p in inboxes["c-copy"].items] == [DATA, DATA, DATA, WATERMARK]
    asyncio.run(scenario())


ORDER: list[tuple[str, int]] = []


class Spin(Operator):
    """Spends ``cost_s`` of this thread's CPU per batch and notes it (an expensive operator)."""

    name = "spin"

    def __init__(self, cost_s: float = 0.02) -> None:
        self.cost_s = cost_s

    def process(self, batch, emit):
        end = time.thread_time() + self.cost_s
        while time.thread_time() < end:
            pass
        ORDER.append(("slow", batch[0]["n"]))


class Note(Operator):
    """Notes each batch (a cheap operator: a sink's work)."""

    name = "note"

    def process(self, batch, emit):
        ORDER.append(("fast", batch[0]["n"]))


def test_a_cheap_input_is_not_kept_waiting_behind_an_expensive_inputs_credit_window():
    async def scenario():
        spec = PESpec("pe", "dep", {"spin": (Spin, {}, None), "note": (Note, {}, None)},
                      [("a", "out", "spin"), ("b", "out", "note")],
                      inputs=[InputSpec("c-a", "a", "out"), InputSpec("c-b", "b", "out")], time_slice_s=0.005)
        pe = PERunner(spec, Hosting("tcp://pe"))
        await pe.connect(lambda cid: (_ for _ in ()).throw(KeyError(cid)), HERE)
        slow, fast = pe.ports.receivers["c-a"], pe.ports.receivers["c-b"]
        for n in range(4):                                    # the expensive window arrived first
            pe.ports.inbox.put(slow, DATA, [{"n": n}])
        for n in range(4):
            pe.ports.inbox.put(fast, DATA, [{"n": n}])
        ORDER.clear()
        take_all(pe)
        assert [n for kind, n in ORDER if kind == "slow"] == [0, 1, 2, 3]     # each input stays FIFO
        assert [n for kind, n in ORDER if kind == "fast"] == [0, 1, 2, 3]
        assert ORDER.index(("fast", 3)) < ORDER.index(("slow", 1)), ORDER     # in arrival order: after all 4
    asyncio.run(scenario())


def test_every_pass_over_an_inbox_with_batches_takes_one():
    """A pass that took nothing would leave the PE loop spinning on its worker's event loop
    without yielding (seen: the monitor got no snapshot for 60 s). Order X, Y, Z with Z having
    spent least and X less than Y: X waits for Z, Y waits for X, Z's batch is taken."""
    async def scenario():
        spec = PESpec("pe", "dep", {op: (Note, {}, None) for op in ("nx", "ny", "nz")},
                      [("x", "out", "nx"), ("y", "out", "ny"), ("z", "out", "nz")],
                      inputs=[InputSpec(f"c-{c}", c, "out") for c in "xyz"])
        pe = PERunner(spec, Hosting("tcp://pe"))
        await pe.connect(lambda cid: (_ for _ in ()).throw(KeyError(cid)), HERE)
        x, y, z = (pe.ports.receivers[f"c-{c}"] for c in "xyz")
        pe.inputs.spent = {id(x): 1.0, id(y): 2.0, id(z): 0.0}
        for n, channel in enumerate((x, y, z)):
            pe.ports.inbox.put(channel, DATA, [{"n": n}])
        ORDER.clear()
        assert pe.inputs.take() and ORDER[0] == ("fast", 2), ORDER
        take_all(pe)
        assert sorted(ORDER) == [("fast", 0), ("fast", 1), ("fast", 2)] and not pe.ports.inbox.items
    asyncio.run(scenario())
