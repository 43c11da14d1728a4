"""A Replicate opens its copy's channels before the pause; the pause only switches the routes.

h30p measured 44-143 ms of connects inside a loaded Replicate's pause: the copy's deploy (its
output channels' connects) and the router's rewire (its new output's connect) ran in the pause's
one round. Now the copy is deployed and every new channel opened first, with nothing routed to
them (``protocol._open_early``, ``Rewirer.open``); the rewire in the pause switches to the very
channels opened then (``Rewirer.rewire``).
"""

from __future__ import annotations

import asyncio
import time

import cloudpickle
from support_ops import Tag

from pescheduler.actions import Replicate
from pescheduler.control.protocol import execute, plan_reconfiguration
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import channel_ids
from pescheduler.wire import InputSpec, OutputSpec, PESpec, RouterTargets
from pescheduler.worker.channels import DATA, WATERMARK, ChannelIn, Inbox
from pescheduler.worker.runtime import Hosting, PERunner

from keyed_handover import WORKERS, placed_keyed_window

HERE = "127.0.0.1:1"
BOTH = {("tag", "out", "w"): (RouterTargets(("w", "w#1"), (1, 1)), None)}
ORIGINAL_ONLY = {("tag", "out", "w"): (RouterTargets(("w",), (1,)), None)}
TO_COPY = OutputSpec("c-copy", "tag", "out", "pe-copy", "tcp://w", HERE, ("w#1",))


class _Gateway:
    """The deployment's calls to its PE hosts, answered at once; ``record``: the calls in the order
    they were asked (and the deploys answered)."""

    deployment = "d"

    def __init__(self) -> None:
        self.record: list[tuple] = []

    async def rewire(self, worker, pe_id, **changes):
        self.record.append(("open" if changes.get("early") else "switch", pe_id,
                            bool(changes.get("outputs") and cloudpickle.loads(changes["outputs"])),
                            bool(changes.get("add_inputs") and cloudpickle.loads(changes["add_inputs"]))))
        return {}

    async def deploy(self, worker, specs):
        self.record.append(("deploy", tuple(s.pe_id for s in specs)))
        await asyncio.sleep(0)
        self.record.append(("deployed", tuple(s.pe_id for s in specs)))
        return {}

    async def calls(self, worker):
        return {"worker": worker, "calls": [], "opening": []}

    async def handover_go(self, worker, tag):
        return None

    async def handover_wait(self, worker, tag, timeout):
        return {"groups": 0, "pending": 0, "bytes": 0, "buffered": 0, "peak": 0, "done_at": time.time(),
                "failed": None}


def test_a_replicates_copy_is_deployed_and_its_channels_opened_before_the_switch():
    """On main the deploy, the downstream's new input and the router's new output were one round,
    the pause's ``deploy + start + rewire``: no call was asked ``early`` and the switch did not
    wait for the deploy."""
    old, window = placed_keyed_window()
    new = transform(old, Replicate(window, 1))
    plan = plan_reconfiguration(old, new, channel_ids(old, "d", 0), "d", 1)
    assert plan.created and not plan.retired and plan.moves, "a live Replicate: nothing retires"
    gateway, steps = _Gateway(), {}
    info = {w: {"host": w, "data_address": w, "pid": 0} for w in WORKERS}
    asyncio.run(execute(gateway, old, new, plan, info, "d/reconf/1", 5.0, steps))
    kinds = [c[0] for c in gateway.record]
    assert "open" in kinds, f"no channel opened before the pause: {gateway.record}"
    switch = kinds.index("switch")
    assert kinds.index("deployed") < switch and "deploy" not in kinds[switch:], gateway.record
    assert all(k != "open" for k in kinds[switch:]), gateway.record
    # the router's new output to the copy and the downstream's new input from it, both opened early
    assert any(c[0] == "open" and c[2] for c in gateway.record), gateway.record
    assert any(c[0] == "open" and c[3] for c in gateway.record), gateway.record
    assert "open" in steps and "switch" in steps and "deploy + start + rewire" not in steps, steps
    assert not [s for s in steps if s.startswith("deploy")], steps


def test_the_rewire_in_the_pause_switches_to_the_channel_opened_before_it():
    """``open_early`` opens the router's output to the copy with nothing routed to it: no data or
    watermark reaches it, until the rewire switches the routes to that very channel (no second
    connect). On main a PE had no ``open_early``: every new channel was opened in the rewire."""
    async def scenario():
        spec = PESpec("up", "dep", {"tag": (Tag, {}, None)}, [("src", "out", "tag")],
                      inputs=[InputSpec("c-src", "src", "out")],
                      outputs=[OutputSpec("c-w", "tag", "out", "pe-w", "tcp://w", HERE, ("w",))],
                      routing=ORIGINAL_ONLY)
        pe = PERunner(spec, Hosting("tcp://up"))
        inboxes = {"c-w": Inbox(), "c-copy": Inbox()}
        receivers = lambda cid: (inboxes[cid], ChannelIn(cid, "tag", "out"))
        await pe.connect(receivers, HERE)
        await pe.open_early([TO_COPY], [], (receivers, HERE, None))
        await pe.opened_early()
        early = pe.rewirer.early["c-copy"]
        assert all(ch.channel_id != "c-copy" for _s, ch in pe.ports.outs), "routed before the switch"
        pe.chain.emit_from("src", [{"n": 1, "ts": 100}, {"n": 2, "ts": 200}])
        pe.chain.watermark_from("src", 300)
        for _spec, channel in pe.ports.outs:
            await channel.flush(wait=False)
        assert not [k for _c, k, _p in inboxes["c-copy"].items if k in (DATA, WATERMARK)], inboxes["c-copy"].items
        await pe.rewire([TO_COPY], [], [], [], None, BOTH, {"w#1": "w"}, (receivers, HERE, None), lambda _p: None)
        assert any(ch is early for _s, ch in pe.ports.outs), "the rewire opened a second channel"
        assert not pe.rewirer.early and not pe.opening()
        for n in (3, 4, 5):                    # smooth round robin by batch: one at least to the copy
            pe.chain.emit_from("src", [{"n": n, "ts": 100 * n}])
        for _spec, channel in pe.ports.outs:
            await channel.flush(wait=False)
        copy = [t["n"] for _c, k, p in inboxes["c-copy"].items if k == DATA for t in p]
        assert copy and set(copy) <= {3, 4, 5}, copy
    asyncio.run(scenario())
