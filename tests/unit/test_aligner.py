"""The Aligner: operators align in topological order once every input delivered the marker;
channels that delivered it are blocked (their later items parked) until the alignment finishes."""

from __future__ import annotations

from support_ops import Tag

from pescheduler.worker.aligner import Aligner
from pescheduler.worker.chain import Chain
from pescheduler.worker.channels import DATA, ChannelIn


def _pe():
    """``m`` reads remote ``a`` (channel c1) and ``b`` (c2); ``t`` reads ``m`` inside the PE."""
    chain = Chain({"m": Tag(), "t": Tag()}, [("a", "out", "m"), ("b", "out", "m"), ("m", "out", "t")])
    receivers = [ChannelIn("c1", "a", "out"), ChannelIn("c2", "b", "out")]
    return chain, receivers


def test_operators_align_in_order_once_every_input_channel_delivered_the_marker():
    chain, receivers = _pe()
    aligner, done = Aligner(), []
    aligner.begin("m1", done.append)
    assert not aligner.advance(chain, receivers) and done == []
    aligner.arrived("c1", "m1")
    assert not aligner.advance(chain, receivers) and done == []      # b has not delivered it yet
    aligner.arrived("c2", "m1")
    assert aligner.advance(chain, receivers) and done == ["m", "t"] and aligner.aligned
    assert not aligner.advance(chain, receivers) and done == ["m", "t"]     # once only


def test_an_ended_channel_needs_no_marker():
    chain, receivers = _pe()
    receivers[1].ended = True
    aligner, done = Aligner(), []
    aligner.begin("m1", done.append)
    aligner.arrived("c1", "m1")
    assert aligner.advance(chain, receivers) and done == ["m", "t"]


def test_a_channel_is_blocked_from_its_marker_until_the_alignment_finishes():
    chain, receivers = _pe()
    c1, c2 = receivers
    aligner = Aligner()
    assert not aligner.park(c1, DATA, [1])                 # not aligning: nothing is blocked
    aligner.arrived("c1", "m0")                            # a marker noted while not aligning
    assert aligner.has_seen("m0", "c1") and not aligner.park(c1, DATA, [1])
    aligner.begin("m1", lambda op_id: None)
    aligner.arrived("c1", "m1")
    assert aligner.park(c1, DATA, [2]) and aligner.park(c1, DATA, [3])    # after c1's marker: next epoch
    assert not aligner.park(c2, DATA, [4])                 # c2's marker is still to come: data flows
    aligner.arrived("c2", "m1")
    assert aligner.advance(chain, receivers)
    assert aligner.finish() == [(c1, DATA, [2]), (c1, DATA, [3])]
    assert not aligner.park(c1, DATA, [5]) and aligner.marker is None and not aligner.aligned


def test_markers_a_pe_never_aligns_on_are_bounded_and_the_newest_is_kept():
    """Issue 20: a PE that stays while its neighbours are replaced notes every marker on its input
    from them and never aligns on one, so ``seen`` grew by one entry per reconfiguration."""
    from pescheduler.worker.aligner import KEEP_MARKERS

    aligner = Aligner()
    aligner.begin("current", lambda op_id: None)
    aligner.arrived("c1", "current")
    for epoch in range(1000):
        aligner.arrived("c1", f"reconf/{epoch}")
    assert len(aligner.seen) == KEEP_MARKERS + 1, "the newest markers and the one being aligned on"
    assert aligner.has_seen("current", "c1") and aligner.has_seen("reconf/999", "c1")
    assert not aligner.has_seen("reconf/0", "c1")


def test_an_input_that_is_removed_takes_its_markers_with_it():
    aligner = Aligner()
    aligner.arrived("c1", "m1")
    aligner.arrived("c2", "m1")
    aligner.arrived("c1", "m2")
    aligner.forget(["c1"])
    assert aligner.seen == {"m1": {"c2": aligner.seen["m1"]["c2"]}}
    aligner.forget(["c2"])
    assert aligner.seen == {}
