"""A drain that does not finish says where every PE stood, so one failure under load tells the
story (issue 20: "did not drain" alone named the PEs, not why they waited).

The PE here is a real runner with a held channel and one out of credit; the failure message
the protocol raises must carry its channels' credits, pending items (their kinds) and holds,
and its inputs' markers.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from test_drain_progress import gateway_to
from test_held_watermarks import _upstream

from pescheduler.control.protocol import ReconfigurationFailed, ReconfigurationPlan, _wait_drained


class _Worker:
    """What ``rpc(worker)`` answers for the two calls a failing drain makes."""

    def __init__(self, pe) -> None:
        self.pe = pe

    async def pe_reconf_wait(self, timeout: float, **_kw) -> dict:
        await asyncio.sleep(timeout)                         # nothing moves
        return {"missing": ["down<-c-copy"], "failed": [], "progress": 7, "times": {}}

    async def pe_stats(self, deployment: str, dead_letters: bool, acked: tuple | None = None) -> dict:
        assert deployment == "dep" and not dead_letters
        return {"worker": "tcp://w", "pes": {self.pe.pe_id: self.pe.stats()}}


def test_a_drain_that_fails_reports_credits_holds_and_markers_of_every_pe():
    async def scenario():
        pe, _inboxes = await _upstream()
        pe.rewirer.hold(["c-copy"], "m1")
        pe.ports.outs[0][1].gate.credits = 0                       # c-w: out of credit
        pe.chain.emit_from("src", [{"n": 1, "ts": 1}])       # w
        pe.chain.emit_from("src", [{"n": 2, "ts": 2}])       # w#1, behind the marker
        await pe.inputs.flush()
        pe.aligner.arrived("c-src", "m1")
        old = SimpleNamespace(workers=("tcp://w",), pes={"up": SimpleNamespace(worker="tcp://w")})
        plan = ReconfigurationPlan(retired=(), created=(), hold={}, seen={"up": ["c-copy"]}, channels={})
        worker = _Worker(pe)
        with pytest.raises(ReconfigurationFailed) as failed:
            await _wait_drained(gateway_to(worker), old, plan, "m1", timeout=1)
        return str(failed.value)

    text = asyncio.run(scenario())
    assert "still waiting for ['down<-c-copy']" in text
    assert "up@tcp://w: running" in text or "up@tcp://w: created" in text
    assert "c-w[cr=0 pend=1 DATA]" in text, text           # out of credit, one batch waiting
    assert "c-copy[cr=" in text and "HELD DATA (holding)" in text, text    # the held channel, a batch behind it
    assert "c-src[M]" in text, text                        # the marker arrived on this input


def test_a_pe_deployed_but_not_started_answers_stats():
    """Created PEs on two workers are deployed, then started in a second round trip; a monitor or
    drain report asking in between got KeyError for the PE's source (it has no chain yet), and
    the worker's whole pe_stats answer failed (seen in test_reconfig_under_load)."""
    from support_ops import Numbers, Tag

    from pescheduler.worker.runtime import Hosting, PERunner
    from pescheduler.wire import PESpec

    spec = PESpec("pe", "dep", {"numbers-1": (Numbers, {"count": 10}, None), "tag-2": (Tag, {}, None)},
                  [("numbers-1", "out", "tag-2")])
    stats = PERunner(spec, Hosting("tcp://w")).stats()
    assert stats["state"] == "created" and stats["operators"] == {}
