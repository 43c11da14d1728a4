"""What the data plane's security costs: one channel between two processes, with and without it.

    python bench/security.py [--quick] [--events 1000000] [--repeat 5]

One sender process streams pre-generated event dicts (batches of 1000) to a
receiver process over loopback through the real channel code
(``TcpChannelOut`` -> ``FrameReceiver`` -> inbox -> decode -> credit back,
8 credits), as two PEs on two workers do. Timed from the sender starting to
connect (the handshake included) to END arriving at the receiver:

  (a) no handshake: the same channel classes with the handshake taken out
      (the bare channel-id HELLO of before), the baseline
  (b) authenticated: challenge, HMAC proof, WELCOME (what every channel does now)
  (c) authenticated over TLS: (b) with the contexts ``distributed.Security`` gives
      a worker (throw-away certificates made here)

Printed: tuples/s of each, (b)/(a) (goal >= 0.98) and (c)/(b) (goal >= 0.7),
best of ``--repeat`` interleaved runs, and the machine's load average. Every run is
checked exactly: the receiver's digest of every DATA payload, in order, equals the
sender's digest of the batches it encoded (taken before and after the timed part), and
the decoded tuples number ``--events``.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import time

from pescheduler.worker.channels import (DATA, END, HEADER, HELLO, ChannelIn, FrameReceiver, Inbox,
                                         TcpChannelOut, decode, encode)
from pescheduler.worker.handshake import Credentials, new_secret, tls_contexts

import options  # bench/, beside this file

CHANNEL = "bench/0/src.out->sink"
VARIANTS = ("none", "auth", "tls")


class NoHandshakeReceiver(FrameReceiver):
    """Baseline only: the receiver as it was before the handshake (any HELLO naming a channel binds it)."""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def _hello(self, kind: int, body: bytes) -> None:
        self.inbox, self.receiver = self.lookup(body.decode())
        self.receiver.grant = self._grant
        self.limit = 0xFFFFFFFF
        self._on_frame = self._frame


class NoHandshakeOut(TcpChannelOut):
    """Baseline only: name the channel, nothing proven. Only the handshake is replaced: the
    connection, its write-buffer limit and the credit reader are the channel's own (the baseline
    once set up its own connection and kept asyncio's 64 KiB write buffer, a different channel)."""

    async def _handshake(self, secret: bytes, address: str) -> None:
        name = self.channel_id.encode()
        self.writer.write(HEADER.pack(len(name), HELLO) + name)


def _tls(variant: str, security):
    return tls_contexts(security) if variant == "tls" else (None, None)


async def _receive(conn, variant: str, secret: bytes, security) -> None:
    inbox, channel = Inbox(), ChannelIn(CHANNEL, "src", "out")
    lookup = {CHANNEL: (inbox, channel)}.__getitem__
    server_ssl, _ = _tls(variant, security)
    if variant == "none":
        factory = lambda: NoHandshakeReceiver(lookup, lambda c: secret)        # noqa: E731
    else:
        factory = lambda: FrameReceiver(lookup, lambda c: secret)              # noqa: E731
    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0, ssl=server_ssl)
    conn.send(server.sockets[0].getsockname()[1])
    tuples, payloads = 0, []
    while True:
        while not inbox.items:
            inbox.event.clear()
            await inbox.event.wait()
        _ch, kind, payload = inbox.items.popleft()
        if kind == DATA:
            tuples += len(decode(payload))
            payloads.append(payload)          # hashed after the clock stops (same on every variant)
            channel.grant()
        elif kind == END:
            t_end = time.monotonic()
            conn.send((tuples, t_end, digest(payloads)))
            break
    await asyncio.sleep(0.1)               # let the close handshake finish before the loop goes
    server.close()


def digest(payloads) -> str:
    """One digest of the DATA payloads in order: equal on both ends only if every byte arrived."""
    h = hashlib.blake2b()
    for payload in payloads:
        h.update(len(payload).to_bytes(8, "little"))
        h.update(payload)
    return h.hexdigest()


def receiver(conn, variant: str, secret: bytes, security) -> None:
    asyncio.run(_receive(conn, variant, secret, security))


async def _send(port: int, variant: str, secret: bytes, security, batches: list) -> float:
    _, client_ssl = _tls(variant, security)
    cls = NoHandshakeOut if variant == "none" else TcpChannelOut
    out = cls(CHANNEL, 8, lambda item, exc: None)
    t0 = time.monotonic()
    await out.connect(f"127.0.0.1:{port}", Credentials(secret, client_ssl))
    for batch in batches:
        out.send(batch)
        await out.flush()
    out.end()
    await out.flush()
    await out.close()
    return t0


def sender(conn, port: int, variant: str, secret: bytes, security, events: int) -> None:
    from pescheduler.operators.sources import GeneratorSource

    gen = GeneratorSource(events=events, keys=10_000, seed=1)
    batches = []
    while (batch := gen.read(1000)) is not None:
        batches.append(batch)
    sent = digest(encode(batch, None) for batch in batches)      # the bytes send() writes, untimed
    conn.send((asyncio.run(_send(port, variant, secret, security, batches)), sent))


def one_run(variant: str, events: int, security) -> float:
    """Tuples/s of one channel, sender and receiver in fresh processes."""
    ctx = multiprocessing.get_context("spawn")
    secret = new_secret()
    r_conn, r_child = ctx.Pipe()
    s_conn, s_child = ctx.Pipe()
    recv = ctx.Process(target=receiver, args=(r_child, variant, secret, security))
    recv.start()
    port = r_conn.recv()
    send = ctx.Process(target=sender, args=(s_child, port, variant, secret, security, events))
    send.start()
    t0, sent = s_conn.recv()
    tuples, t_end, received = r_conn.recv()
    send.join(60)
    recv.join(60)
    assert tuples == events, f"{variant}: {tuples} of {events} tuples arrived"
    assert received == sent, f"{variant}: the bytes received differ from the batches sent"
    return events / (t_end - t0)


def main() -> None:
    from distributed import Security

    args = options.arguments(__doc__, 1_000_000, 5, 100_000, "interleaved runs of each variant; the best counts")
    security = Security.temporary()
    load_before = os.getloadavg()
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):           # interleaved: this machine's speed drifts
        for variant in VARIANTS:
            rates[variant].append(one_run(variant, args.events, security))
    load_after = os.getloadavg()
    best = {v: max(r) for v, r in rates.items()}
    print(f"one channel between two processes, {args.events:,} event dicts in batches of 1000, "
          f"best of {args.repeat} interleaved runs; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after ({os.cpu_count()} cores)")
    print(f"  (a) no handshake (baseline)          {best['none'] / 1e6:6.2f} M tuples/s")
    print(f"  (b) authenticated (HMAC handshake)   {best['auth'] / 1e6:6.2f} M tuples/s   "
          f"{best['auth'] / best['none']:.3f}x (a)  (goal >= 0.98)")
    print(f"  (c) authenticated, TLS               {best['tls'] / 1e6:6.2f} M tuples/s   "
          f"{best['tls'] / best['auth']:.3f}x (b)  (goal >= 0.7)")
    print("  all runs (M tuples/s): " + "; ".join(
        f"{v} " + " ".join(f"{r / 1e6:.2f}" for r in rates[v]) for v in VARIANTS))


if __name__ == "__main__":
    main()
