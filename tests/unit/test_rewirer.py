"""A PE's side of a reconfiguration (worker/rewirer.py), driven directly with the parts it is given:
a PE being replaced aligns on the marker and holds its outputs behind it, and says how far it is."""

from __future__ import annotations

import asyncio

from test_source_pump import Trickle

from pescheduler.operators.basic import Map
from pescheduler.wire import InputSpec, PESpec
from pescheduler.worker.aligner import Aligner
from pescheduler.worker.chain import Chain
from pescheduler.worker.channels import MARKER, ChannelIn, Inbox, LocalChannelOut
from pescheduler.worker.flow import InputScheduler
from pescheduler.worker.ports import Ports
from pescheduler.worker.rewirer import Rewirer
from pescheduler.worker.source_driver import Sources
from pescheduler.worker.turns import Turns


def _replaced_pe():
    """A PE with a source and a map fed by channels c-a and c-b; the map's output goes to ``down``."""
    ops = {"src": Trickle([[{"x": 1, "ts": 1}]]), "m": Map(lambda t: t)}
    spec = PESpec("pe", "d", {}, [("src", "out", "m"), ("a", "out", "m"), ("b", "out", "m")],
                  inputs=[InputSpec("c-a", "a", "out"), InputSpec("c-b", "b", "out")])
    ports, sources, aligner = Ports(spec, None, lambda *d: None), Sources(ops, 100), Aligner()
    down = Inbox()
    out = LocalChannelOut("c-down", 8, down, ChannelIn("c-down", "m", "out"))
    ports.outs.append((_out_spec(), out))
    inputs = InputScheduler(ports.inbox, ports.outs, 8, 0.05, lambda: 0.0, aligner.park, lambda *item: None)
    rewirer = Rewirer(ports, aligner, inputs, sources, Turns("pe", 0.05))
    rewirer.chain = inputs.chain = Chain(ops, spec.edges, {("m", "out"): [out]})
    return rewirer, ports, sources, aligner, out, down


def _out_spec():
    from pescheduler.wire import OutputSpec
    return OutputSpec("c-down", "m", "out", "pe-down", "tcp://w", "127.0.0.1:1", ("down",))


def test_a_replaced_pe_pauses_its_sources_and_holds_each_output_once_its_operator_aligned():
    async def scenario():
        rewirer, ports, sources, aligner, out, down = _replaced_pe()
        rewirer.align("m1")
        assert all(d.paused for d in sources) and aligner.marker == "m1"
        assert rewirer.status("m1") == {"missing": ["aligned"], "progress": 0, "times": {}}
        aligner.arrived("c-a", "m1")
        assert not aligner.advance(rewirer.chain, ports.receivers.values()), "c-b has not delivered it"
        assert not out.holding and rewirer.status("m1", ["c-a", "c-b"])["missing"] == ["c-b"]
        aligner.arrived("c-b", "m1")
        assert aligner.advance(rewirer.chain, ports.receivers.values())
        assert out.holding and ports.inbox.event.is_set(), "held behind the marker, the PE woken to ship it"
        await out.flush()
        assert out.held and [(kind, p) for _c, kind, p in down.items] == [(MARKER, "m1")]
        status = rewirer.status("m1")
        assert status["missing"] == [] and "aligned" in status["times"] and status["progress"] >= 3
    asyncio.run(scenario())


def test_a_pe_that_stays_counts_only_the_listed_channels_toward_the_drain():
    rewirer, ports, _sources, aligner, _out, _down = _replaced_pe()
    ports.receivers["c-a"].tuples, ports.receivers["c-b"].tuples = 5, 100
    assert rewirer.status("m1", ["c-a"]) == {"missing": ["c-a"], "progress": 5, "times": {}}
    aligner.arrived("c-a", "m1")
    status = rewirer.status("m1", ["c-a"])
    assert status["missing"] == [] and status["progress"] == 6 and list(status["times"]) == ["c-a"]
    ports.receivers["c-b"].ended = True
    assert rewirer.status("m1", ["c-b"])["missing"] == [], "an ended channel brings no marker"
