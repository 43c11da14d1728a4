"""An input channel opened before its edge: what it carries waits for the edge.

A Replicate opens the copy's channels before its pause (``protocol._open_early``): the PE
downstream registers the copy's channel as an input then, and learns the edge from the copy
to its operator only in the pause, in the same round of parallel calls in which the upstream
PE switches its router to the copy. Where the upstream's call ran first, the copy processed
and shipped batches that the PE downstream took before its own call came: with no route from
the copy in its chain, ``Chain.emit_from`` delivered them nowhere. ``bench/parallel.py --quick``
ended 3,000-16,000 tuples short in 3 of 10 loaded runs that way, every PE finished (a
warm-slot copy of a stateless map, fused downstream with the sink). Here on a real PE runner
with in-memory channels, the upstream's call first. The inputs' fair share (``flow.py``) must
not give the turn to an input that waits: that PE took nothing and never yielded, and the
rewire that would wire the input never ran (the first fix: 6 of 18 loaded runs stalled).
"""

from __future__ import annotations

import asyncio

import pytest
from inbox import take_all
from test_held_watermarks import _upstream

from pescheduler.wire import InputSpec
from pescheduler.worker.channels import DATA, END

EDGES = [("src", "out", "tag"), ("src#1", "out", "tag")]      # tag's inputs once the copy src#1 is wired


def _numbers(inbox) -> list[int]:
    return [t["n"] for _c, kind, payload in inbox.items if kind == DATA for t in payload]


def test_a_batch_on_an_input_opened_before_its_edge_waits_for_the_edge_then_goes_on():
    async def scenario():
        pe, inboxes = await _upstream()
        pe.rewirer.set_inputs([InputSpec("c-src1", "src#1", "out")], [])     # open: registered, no edge yet
        early = pe.ports.receivers["c-src1"]
        pe.ports.inbox.put(early, DATA, [{"n": 1, "ts": 1}, {"n": 2, "ts": 2}])  # the copy's first batch
        pe.inputs.take()
        assert pe.chain.nodes["tag"].stats.tuples_in == 0
        assert [kind for _c, kind, _p in pe.ports.inbox.items] == [DATA], "the batch waits in the inbox"
        assert not pe.inputs.ready(), "a batch that waits for its edge is no work: the PE idles, it does not spin"
        wired = pe.ports.receivers["c-src"]
        for n in (3, 4):                       # interleaved with the copy's next batches: the input
            pe.ports.inbox.put(wired, DATA, [{"n": n, "ts": n}] * 500)     # that waits must never have
            pe.ports.inbox.put(early, DATA, [{"n": 10 + n, "ts": n}])       # the turn (flow.py's fair
        pe.ports.inbox.put(wired, DATA, [{"n": 5, "ts": 5}] * 500)         # share): the first fix spun
        pe.ports.inbox.put(early, END, None)                               # there; its END behind its data
        take_all(pe, turns=10, leaving=4)
        assert pe.chain.nodes["tag"].stats.tuples_in == 1500
        assert [kind for _c, kind, _p in pe.ports.inbox.items] == [DATA, DATA, DATA, END]
        pe.ports.inbox.event.clear()
        pe.rewirer.set_inputs([], [], EDGES, {"src#1": "src", "w#1": "w"})   # the pause's rewire: the edge
        assert pe.ports.inbox.event.is_set(), "the PE wakes for the input that waited"
        pe.inputs.take()
        assert pe.chain.nodes["tag"].stats.tuples_in == 1504 and not pe.ports.inbox.items
        assert "src#1" not in pe.chain.nodes["tag"].open_inputs, "its END came after its data"
        for _spec, out in pe.ports.outs:
            await out.flush(wait=False)
        assert sorted(_numbers(inboxes["c-w"]) + _numbers(inboxes["c-copy"])) == [1, 2] + [3] * 500 + [4] * 500 + [5] * 500 + [13, 14]
    asyncio.run(scenario())


def test_a_batch_that_no_operator_takes_fails_the_pe_instead_of_going_nowhere():
    """The loss above was silent: the batch was counted in and delivered to no route. A wired
    channel whose operator no longer takes its input is a bug; the PE fails, saying so."""
    async def scenario():
        pe, _inboxes = await _upstream()
        pe.chain.set_edges([])                                 # nothing here takes src's output now
        pe.ports.inbox.put(pe.ports.receivers["c-src"], DATA, [{"n": 1, "ts": 1}])
        with pytest.raises(RuntimeError, match=r"channel c-src brought 1 tuples of 'src', which no operator of "
                                                 r"PE up takes: they would be lost"):
            pe.inputs.take()
    asyncio.run(scenario())
