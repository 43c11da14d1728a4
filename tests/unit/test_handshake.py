"""The data plane's handshake, over real loopback sockets: a real FrameReceiver server, real senders.

What the intruder tests in tests/integration/test_security.py do against a
deployment, done here piece by piece where each outcome can be looked at
directly: the receiver's state, its inbox, who holds its credit.
"""

from __future__ import annotations

import asyncio
import gc
import pickle
import struct

import pytest

from pescheduler.worker import handshake
from pescheduler.worker.channels import (CHALLENGE, CREDIT, DATA, END, HEADER, HELLO, MALFORMED, MARKER,
                                         WATERMARK, WELCOME, WM, ChannelIn, FrameReceiver, Inbox,
                                         TcpChannelOut, encode)
from pescheduler.worker.handshake import Credentials, HandshakeRefused
from inbox import take_all

CHANNEL = "dep-1/0/src.out->pe-2"
BOUND = 10.0       # seconds: every wait in this file is bounded by this


class Host:
    """One data server with one receiving channel, as a PE host has (lookup and secret_of)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.inbox = Inbox()
        self.receiver = ChannelIn(CHANNEL, "src", "out")
        self.original_grant = self.receiver.grant
        self.protocols: list[FrameReceiver] = []
        self.server = None

    def lookup(self, channel_id):
        if channel_id != CHANNEL:
            raise KeyError(f"no PE here receives channel {channel_id!r}")
        return self.inbox, self.receiver

    def secret_of(self, channel_id):
        self.lookup(channel_id)
        return self.secret

    async def proven_sender(self) -> TcpChannelOut:
        """A sender holding the secret, connected (one credit)."""
        out = TcpChannelOut(CHANNEL, credits=1, dead_letter=lambda item, exc: None)
        await out.connect(self.address, Credentials(self.secret))
        return out

    def protocol(self) -> FrameReceiver:
        p = FrameReceiver(self.lookup, self.secret_of)
        self.protocols.append(p)
        return p

    async def __aenter__(self) -> "Host":
        self.server = await asyncio.get_running_loop().create_server(self.protocol, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def items(self, n: int) -> list:
        """The first ``n`` inbox items (waits for them, bounded)."""
        async with asyncio.timeout(BOUND):
            while len(self.inbox.items) < n:
                self.inbox.event.clear()
                await self.inbox.event.wait()
        return [(kind, payload) for _ch, kind, payload in list(self.inbox.items)[:n]]


def frame(kind: int, body: bytes = b"") -> bytes:
    return HEADER.pack(len(body), kind) + body


async def raw(address: str):
    host, port = address.split(":")
    return await asyncio.open_connection(host, int(port))


async def read_frame(reader) -> tuple[int, bytes]:
    length, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
    return kind, await reader.readexactly(length)


async def closed_by_peer(reader) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    got = b""
    async with asyncio.timeout(BOUND):
        try:
            while chunk := await reader.read(65536):
                got += chunk
        except ConnectionResetError:
            pass
    return got


def run(coro):
    return asyncio.run(coro)


def test_a_sender_with_the_secret_gets_through_and_credit_comes_back():
    async def scenario():
        async with Host(handshake.new_secret()) as host:
            out = await host.proven_sender()
            out.send([{"n": 1}])
            out.watermark(42)
            out.hold(("dep-1/reconf/1", 7))
            await out.flush()
            items = await host.items(3)
            assert items[0][0] == DATA and pickle.loads(items[0][1]) == [{"n": 1}]
            assert items[1] == (WATERMARK, 42)
            assert items[2] == (MARKER, ("dep-1/reconf/1", 7))       # msgpack: a tuple, hashable
            assert out.gate.credits == 0
            host.receiver.grant()                                     # the PE took the batch
            async with asyncio.timeout(BOUND):
                await out.gate.acquire()                              # the credit came back
            await out.close(timeout=1)
    run(scenario())


def test_large_arrow_frames_and_small_pickles_arrive_whole_and_in_order():
    """Frames of at least FrameReceiver.BIG bytes are received into buffers of their own (no copy
    out of the shared one): they must come out byte-exact, with the small frames around them."""
    import pyarrow as pa                          # in [dev]: the test runs in CI, never skipped

    from pescheduler.worker.channels import decode

    big = pa.RecordBatch.from_pydict({"ts": list(range(300_000)), "v": [i / 7 for i in range(300_000)]})
    small = big.slice(0, 10)

    async def scenario():
        async with Host(handshake.new_secret()) as host:
            out = TcpChannelOut(CHANNEL, credits=4, dead_letter=lambda item, exc: None)
            await out.connect(host.address, Credentials(host.secret))
            for batch in (big, [{"n": 1}], small, big):
                out.send(batch)
            out.watermark(7)
            await out.flush()
            items = await host.items(5)
            assert [kind for kind, _ in items] == [DATA] * 4 + [WATERMARK]
            got = [decode(payload) for _, payload in items[:4]]
            assert got[0].equals(big) and got[3].equals(big) and got[2].equals(small)
            assert got[1] == [{"n": 1}]
            assert len(items[0][1]) > FrameReceiver.BIG > len(items[2][1])
            assert host.protocols[0].big is None and len(host.protocols[0].buf) == FrameReceiver.CHUNK
            await out.close(timeout=1)
    run(scenario())


def _numbered(i: int, rows: int = 100_000):
    import pyarrow as pa

    return pa.RecordBatch.from_pydict({"ts": pa.array(range(i * rows, (i + 1) * rows)),
                                       "v": pa.array([i + 0.5] * rows)})


def test_frames_in_pooled_memory_stay_exact_while_later_frames_reuse_it():
    """Large frames are received into Arrow's memory pool (frame_buffer), which hands memory freed
    by earlier frames to later ones. A batch decoded from a frame, and a frame still undecoded in the
    inbox, must stay exact however many frames arrive after them (a pool that handed out a buffer
    still referenced would overwrite them), and the memory must go back once nothing holds it."""
    import pyarrow as pa

    from pescheduler.worker.channels import decode

    async def scenario():
        async with Host(handshake.new_secret()) as host:
            out = TcpChannelOut(CHANNEL, credits=64, dead_letter=lambda item, exc: None)
            await out.connect(host.address, Credentials(host.secret))
            gc.collect()                          # earlier tests' Arrow garbage goes now, not mid-count
            base = pa.total_allocated_bytes()
            out.send(_numbered(0))
            out.send(_numbered(1))
            await out.flush()
            (_, first), (_, second) = await host.items(2)
            assert isinstance(first.obj, pa.Buffer) and isinstance(second.obj, pa.Buffer)
            frame_bytes = len(first)
            kept = decode(first)                  # decoded and held; its frame is dropped below
            undecoded = second                    # a frame still encoded, as the inbox holds it
            host.inbox.items.clear()
            del first, second
            for i in range(2, 40):
                out.send(_numbered(i))
                await out.flush()
                (_, payload), = await host.items(1)
                host.inbox.items.clear()
                got = decode(payload)
                del payload
                assert got.equals(_numbered(i))
                del got                           # its memory goes back to the pool for the next frame
            assert kept.equals(_numbered(0))
            assert decode(undecoded).equals(_numbered(1))
            assert pa.total_allocated_bytes() - base >= 2 * frame_bytes     # both still held
            del kept, undecoded
            assert pa.total_allocated_bytes() - base < frame_bytes         # and released
            await out.close(timeout=1)
    run(scenario())


def test_wrong_secret_is_refused_and_touches_nothing():
    async def scenario():
        async with Host(handshake.new_secret()) as host:
            out = TcpChannelOut(CHANNEL, credits=8, dead_letter=lambda item, exc: None)
            with pytest.raises(HandshakeRefused, match="closed channel"):
                await out.connect(host.address, Credentials(handshake.new_secret()))
            assert host.receiver.grant is host.original_grant        # credit not re-pointed
            assert not host.inbox.items
            assert host.protocols[0].receiver is None
    run(scenario())


def test_a_server_that_cannot_prove_the_secret_is_not_trusted():
    """WELCOME is checked: whatever took over a data port learns nothing and gets no data."""
    async def impostor(reader, writer):
        writer.write(frame(CHALLENGE, handshake.new_nonce()))
        await read_frame(reader)
        writer.write(frame(WELCOME, b"\0" * 32))
        await writer.drain()

    async def scenario():
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        address = "127.0.0.1:%d" % server.sockets[0].getsockname()[1]
        out = TcpChannelOut(CHANNEL, credits=8, dead_letter=lambda item, exc: None)
        with pytest.raises(HandshakeRefused, match="did not prove"):
            await out.connect(address, Credentials(handshake.new_secret()))
        server.close()
    run(scenario())


@pytest.mark.parametrize("attack", ["old-hello", "replayed-proof", "no-proof", "data-first",
                                    "pickle-marker-first", "huge-length", "garbage"])
def test_unproven_peers_are_closed_before_any_receiver_is_touched(attack, tmp_path):
    evil = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(evil), "w"))

    async def scenario():
        secret = handshake.new_secret()
        async with Host(secret) as host:
            reader, writer = await raw(host.address)
            kind, nonce = await read_frame(reader)
            assert kind == CHALLENGE and len(nonce) == handshake.NONCE_BYTES
            mine = handshake.new_nonce()
            if attack == "old-hello":             # the pre-handshake protocol: the bare channel id
                writer.write(frame(HELLO, CHANNEL.encode()) + frame(DATA, pickle.dumps([{"n": -1}])))
            elif attack == "replayed-proof":      # a proof that was valid for another connection's nonce
                proof = handshake.client_proof(secret, handshake.new_nonce(), mine, CHANNEL)
                writer.write(frame(HELLO, handshake.encode_hello(CHANNEL, mine, proof)))
            elif attack == "no-proof":
                writer.write(frame(HELLO, handshake.encode_hello(CHANNEL, mine, b"")))
            elif attack == "data-first":
                writer.write(frame(DATA, pickle.dumps([{"n": -1}])) + frame(WATERMARK, WM.pack(10**12)))
            elif attack == "pickle-marker-first":
                writer.write(frame(MARKER, pickle.dumps(Payload())))
            elif attack == "huge-length":
                writer.write(HEADER.pack(0xFFFFFFF0, HELLO) + b"x" * 1000)
            else:
                writer.write(bytes(range(256)) * 8)
            await writer.drain()
            rest = await closed_by_peer(reader)
            assert WELCOME not in [k for k, _ in _frames(rest)]
            assert host.receiver.grant is host.original_grant
            assert not host.inbox.items
            assert all(p.receiver is None for p in host.protocols)
            assert len(host.protocols[0].buf) == FrameReceiver.UNPROVEN_CHUNK   # nothing buffered for a huge frame
            writer.close()
    run(scenario())
    assert not evil.exists()


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while len(data) >= HEADER.size:
        length, kind = HEADER.unpack_from(data)
        out.append((kind, data[HEADER.size:HEADER.size + length]))
        data = data[HEADER.size + length:]
    return out


def test_an_intruder_cannot_take_credit_from_the_real_sender():
    async def scenario():
        async with Host(handshake.new_secret()) as host:
            out = await host.proven_sender()
            bound = host.receiver.grant
            reader, writer = await raw(host.address)          # the intruder: a bare HELLO, then gone
            await read_frame(reader)
            writer.write(frame(HELLO, CHANNEL.encode()))
            await closed_by_peer(reader)
            writer.close()
            assert host.receiver.grant == bound               # still the real sender's connection
            out.send([{"n": 1}])
            await out.flush()
            await host.items(1)
            host.receiver.grant()
            async with asyncio.timeout(BOUND):
                await out.gate.acquire()
            await out.close(timeout=1)
    run(scenario())


def test_silence_after_connecting_is_closed(monkeypatch):
    monkeypatch.setattr(handshake, "HANDSHAKE_TIMEOUT_S", 0.2)

    async def scenario():
        async with Host(handshake.new_secret()) as host:
            reader, writer = await raw(host.address)
            rest = await closed_by_peer(reader)
            assert [k for k, _ in _frames(rest)] == [CHALLENGE]
            writer.close()
    run(scenario())


def test_unreadable_frames_from_a_proven_peer_are_dead_letters_naming_the_channel(tmp_path):
    """A bug in a proven peer (a bad marker, a bad watermark, an unknown kind) does not stop the channel.
    Markers are msgpack even from a proven peer: one carrying a pickle that would create a file is a
    dead letter too, and no file exists (issue 19: no pickle for control frames)."""
    evil = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(evil), "w"))

    async def scenario():
        secret = handshake.new_secret()
        async with Host(secret) as host:
            reader, writer = await raw(host.address)
            _kind, nonce = await read_frame(reader)
            mine = handshake.new_nonce()
            proof = handshake.client_proof(secret, nonce, mine, CHANNEL)
            writer.write(frame(HELLO, handshake.encode_hello(CHANNEL, mine, proof)))
            kind, welcome = await read_frame(reader)
            assert kind == WELCOME and welcome == handshake.server_proof(secret, nonce, mine, CHANNEL)
            writer.write(frame(MARKER, b"\xc1") + frame(WATERMARK, b"123") + frame(99, b"?")
                         + frame(MARKER, pickle.dumps(Payload(), protocol=5))
                         + frame(DATA, encode([{"n": 2}], None)) + frame(END))
            items = await host.items(6)
            assert [k for k, _ in items] == [MALFORMED, MALFORMED, MALFORMED, MALFORMED, DATA, END]
            assert "frame kind 6" in items[0][1][1] and "frame kind 99" in items[2][1][1]
            assert "frame kind 6" in items[3][1][1]
            writer.close()
    run(scenario())
    assert not evil.exists(), "a marker was unpickled"


def test_a_pe_dead_letters_an_unreadable_batch_and_goes_on():
    """The PE side of the above: an undecodable DATA batch is a dead letter naming the channel."""
    from pescheduler.worker.runtime import Hosting, InputSpec, PERunner, PESpec
    from support_ops import Collect

    async def scenario():
        spec = PESpec("pe-2", "dep-1", {"sink": (Collect, {}, None)}, [("src", "out", "sink")],
                      inputs=[InputSpec(CHANNEL, "src", "out")])
        pe = PERunner(spec, Hosting("tcp://127.0.0.1:1"))
        await pe.connect(lambda c: (_ for _ in ()).throw(KeyError(c)), "127.0.0.1:1")
        pe._loop = asyncio.get_running_loop()
        channel = pe.ports.receivers[CHANNEL]
        for payload in (b"not a pickle", encode([{"n": 1}], None)):
            pe.ports.inbox.put(channel, DATA, payload)
        pe.ports.inbox.put(channel, MALFORMED, (b"\xc1", "frame kind 6: bad marker"))
        take_all(pe)
        assert pe.ops["sink"].items == [{"n": 1}]
        dead = pe.take_dead_letters()
        assert [d.operator for d in dead] == [f"channel {CHANNEL}"] * 2
        assert dead[0].item == b"not a pickle" and "Unpickling" in dead[0].error
    run(scenario())


def test_tls_contexts_follow_distributed_security():
    from distributed import Security

    assert handshake.tls_contexts(Security()) == (None, None)
    server, client = handshake.tls_contexts(Security.temporary())
    assert server is not None and client is not None
    with pytest.raises(RuntimeError, match="refuses to run in the clear"):
        handshake.tls_contexts(Security(require_encryption=True))


def test_credentials_never_print_the_secret():
    secret = handshake.new_secret()
    assert secret.hex() not in repr(Credentials(secret)) and str(secret) not in repr(Credentials(secret))


def test_frame_kinds_do_not_collide():
    kinds = [DATA, WATERMARK, END, CREDIT, HELLO, MARKER, CHALLENGE, WELCOME, MALFORMED]
    assert len(set(kinds)) == len(kinds)
    assert struct.calcsize("!B") == 1 and all(0 < k < 256 for k in kinds if k != MALFORMED)



# -- the gate: what unauthenticated connections may cost a worker ------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_gate_caps_pending_connections_and_admits_again_when_one_ends():
    gate = handshake.HandshakeGate(max_pending=3, per_second=100, log_every_s=10, clock=Clock())
    assert [gate.admit("peer") for _ in range(5)] == [True, True, True, False, False]
    gate.done()
    assert gate.admit("peer") and not gate.admit("peer")


def test_the_gate_limits_new_connections_per_second_with_bursts_up_to_the_rate():
    clock = Clock()
    gate = handshake.HandshakeGate(max_pending=1000, per_second=4, log_every_s=10, clock=clock)
    assert sum(gate.admit("peer") for _ in range(10)) == 4
    clock.now = 0.5
    assert sum(gate.admit("peer") for _ in range(10)) == 2


def test_refusals_are_logged_once_per_interval_with_their_count(caplog):
    clock = Clock()
    gate = handshake.HandshakeGate(max_pending=0, per_second=100, log_every_s=10, clock=clock)
    with caplog.at_level("WARNING", logger="pescheduler.worker.handshake"):
        for _ in range(500):
            gate.admit(("10.0.0.9", 4242))
        clock.now = 10.0
        gate.refuse(("10.0.0.9", 4242), "wrong proof")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("refused 1 data connection(s)")
    assert lines[1].startswith("refused 500 data connection(s) in the last 10 s; the last from ('10.0.0.9', 4242): "
                               "wrong proof")
