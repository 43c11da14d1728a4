"""Activation in one round of calls: no call waits for another's answer (issue 15).

Two real PE hosts on loopback (their data servers, handshakes and PE loops), as
the protocol's last round (``protocol.execute``) drives them: the upstream
PE is pointed at a created PE, the created PE is deployed and started, and the
downstream PE registers the created PE's channel, all at once and here in the
worst order: the upstream first (the created PE is not deployed yet), the
downstream last (the created PE already sends to it). Every tuple must arrive
once and in order all the same, and the created PE (a copy, in a Replicate)
must work from its first batch on, not from the moment the downstream worker
answered.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import cloudpickle
import pytest
from tests.waiting import until_async
from support_ops import Collect, Tag

from pescheduler.worker import handshake
from pescheduler.worker.channels import DATA, TcpChannelOut
from pescheduler.worker.handshake import Credentials, HandshakeRefused
from pescheduler.worker.pehost import PEHost
from pescheduler.wire import InputSpec, OutputSpec, PESpec

DEP = "dep-a"
BOUND = 10.0                       # seconds: every wait here is bounded by this
IN_UP = f"{DEP}/0/src.out->up"
UP_DOWN = f"{DEP}/0/tag.out->down"
UP_NEW = f"{DEP}/1/tag.out->new"
NEW_DOWN = f"{DEP}/1/tag2.out->down"


async def _host(secret: bytes, name: str) -> PEHost:
    host = PEHost(SimpleNamespace(address=f"tcp://127.0.0.1:{name}", handlers={}, ip="127.0.0.1"))
    await host.start()
    host.pe_secret(DEP, secret)
    return host


def _out(channel_id, src, dst_pe, host, dst_ops) -> OutputSpec:
    return OutputSpec(channel_id, src, "out", dst_pe, host.worker.address, host.data_address, dst_ops)


def _until(predicate, what: str):
    """Yield to the loop until ``predicate()``, bounded by BOUND: the PEs run on this very loop."""
    return until_async(predicate, BOUND, what)


def test_a_created_pe_works_before_its_downstream_knows_it_and_nothing_is_lost_or_doubled():
    async def scenario():
        secret = handshake.new_secret()
        a, b = await _host(secret, "a"), await _host(secret, "b")
        try:
            # before: up (on b) tags and sends to down (on a), which collects
            down = PESpec("down", DEP, {"sink": (Collect, {}, None)}, [("tag", "out", "sink")],
                          inputs=[InputSpec(UP_DOWN, "tag", "out")])
            await a.pe_deploy(cloudpickle.dumps([down]), start=True)
            up = PESpec("up", DEP, {"tag": (Tag, {}, None)}, [("src", "out", "tag")],
                        inputs=[InputSpec(IN_UP, "src", "out")], outputs=[_out(UP_DOWN, "tag", "down", a, ("sink",))])
            await b.pe_deploy(cloudpickle.dumps([up]), start=True)
            up_pe, down_pe = b.pes[(DEP, "up")], a.pes[(DEP, "down")]
            sunk = down_pe.ops["sink"].items
            up_pe.ports.inbox.put(up_pe.ports.receivers[IN_UP], DATA, [{"n": 0}])
            await _until(lambda: len(sunk) == 1, "the first tuple reaches down")

            # the round, worst order first: up sends to "new", not deployed yet on its worker
            rewire_up = asyncio.create_task(b.pe_rewire(
                DEP, "up", outputs=cloudpickle.dumps([_out(UP_NEW, "tag", "new", b, ("tag2",))]),
                remove_outputs=[UP_DOWN]))
            await _until(lambda: [ch.channel_id for _s, ch in up_pe.ports.outs] == [UP_NEW], "up switches")
            up_pe.ports.inbox.put(up_pe.ports.receivers[IN_UP], DATA, [{"n": 1}])      # waits in the opening channel
            await asyncio.sleep(0.05)
            assert not rewire_up.done(), "the rewire answered before its channel's receiver existed"

            # "new" starts and sends to down, which has not registered the channel yet
            new = PESpec("new", DEP, {"tag2": (Tag, {"tag": "new"}, None)}, [("tag", "out", "tag2")],
                         inputs=[InputSpec(UP_NEW, "tag", "out")], outputs=[_out(NEW_DOWN, "tag2", "down", a, ("sink",))])
            deploy = asyncio.create_task(b.pe_deploy(cloudpickle.dumps([new]), start=True))
            await _until(lambda: (DEP, "new") in b.pes and b.pes[(DEP, "new")].figures.first_input_at,
                         "the created PE processes its first batch")
            assert b.pes[(DEP, "new")].ports.outs[0][1].opening is not None, "its output opened before down knew it"
            answer = await asyncio.wait_for(rewire_up, BOUND)
            assert set(answer["ms"]) >= {"turn wait", "outputs", "connect"}
            up_pe.ports.inbox.put(up_pe.ports.receivers[IN_UP], DATA, [{"n": 2}])
            await asyncio.sleep(0.05)
            assert not deploy.done() and len(sunk) == 1

            # down registers the channel last: what "new" sent arrives, once and in order
            await a.pe_rewire(DEP, "down", add_inputs=cloudpickle.dumps([InputSpec(NEW_DOWN, "tag2", "out")]),
                              remove_inputs=[UP_DOWN], edges=cloudpickle.dumps([("tag2", "out", "sink")]))
            answer = await asyncio.wait_for(deploy, BOUND)
            assert answer["pes"] == ["new"] and answer["ms"]["connect"] > 0
            await _until(lambda: len(sunk) == 3, "what the created PE took reaches down")
            up_pe.ports.inbox.put(up_pe.ports.receivers[IN_UP], DATA, [{"n": 3}])
            await _until(lambda: len(sunk) == 4, "a later tuple reaches down")
            assert sunk == [{"n": 0, "tag": "x"}] + [{"n": n, "tag": "new"} for n in (1, 2, 3)]
        finally:
            await b.close()
            await a.close()
    asyncio.run(scenario())


def test_a_channel_whose_receiver_never_comes_fails_the_call_after_the_handshake_time(monkeypatch):
    monkeypatch.setattr(handshake, "HANDSHAKE_TIMEOUT_S", 0.5)

    async def scenario():
        secret = handshake.new_secret()
        a, b = await _host(secret, "a"), await _host(secret, "b")
        try:
            lost = PESpec("lost", DEP, {"tag": (Tag, {}, None)}, [("src", "out", "tag")],
                          inputs=[InputSpec(IN_UP, "src", "out")],
                          outputs=[_out(f"{DEP}/1/tag.out->nobody", "tag", "nobody", a, ("sink",))])
            t0 = time.monotonic()
            with pytest.raises(HandshakeRefused, match="no receiver for it there"):
                await asyncio.wait_for(b.pe_deploy(cloudpickle.dumps([lost]), start=True), BOUND)
            assert time.monotonic() - t0 >= 0.4
        finally:
            await b.close()
            await a.close()
    asyncio.run(scenario())


def test_a_wrong_proof_for_a_channel_still_to_come_is_refused_at_once():
    """Only a proven sender waits for a receiver: a stranger naming a channel of the deployment
    is closed at once, as before, and nothing waits on its behalf."""
    async def scenario():
        a = await _host(handshake.new_secret(), "a")
        try:
            out = TcpChannelOut(f"{DEP}/1/tag.out->later", 8, lambda item, exc: None)
            t0 = time.monotonic()
            with pytest.raises(HandshakeRefused, match="closed channel"):
                await asyncio.wait_for(out.connect(a.data_address, Credentials(handshake.new_secret())), BOUND)
            assert time.monotonic() - t0 < handshake.HANDSHAKE_TIMEOUT_S / 2
        finally:
            await a.close()
    asyncio.run(scenario())
