"""Channel benchmark: pescheduler's channel between two worker processes against a raw socket loop.

    python bench/channel.py [--events 4000000] [--arrow-events 20000000] [--repeat 3] [--quick]

Both sides of every comparison carry the same pre-made data over TCP on this
host, measured in the same run (the machine is shared: read the ratios):

  event dicts, batches of 1,000 (the generator's connected-car events):
    raw socket loop   one process pickles each batch (protocol 5) and sends it
                      with a length header; the other receives and unpickles it
                      (cyclic GC paused, as the channel does) - the hand-written
                      equivalent of the channel's work, the strongest honest baseline
    pescheduler       ``replay`` -> ``throughput`` on a 2-worker deployment
                      (authenticated channel, credits, watermarks), then the
                      per-batch latency at half that rate (p50/p99; goal p99 <= 10 ms)
  Arrow record batches of 65,536 rows x 5 columns:
    raw socket loop   one process sends the batches' IPC stream bytes (encoded
                      before the clock starts); the other receives each into its
                      own buffer and opens it zero-copy as a RecordBatch
    pescheduler       ``replay(columnar=True)`` -> ``throughput`` on 2 workers

Every receiver checks what arrived: the count and the sum of the ``ts``
field of every tuple must be exactly what was sent (exit 1 if not).
Goals (issue 16): >= 2 M event tuples/s; Arrow IPC >= 50 M values/s.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import socket
import statistics
import struct
import sys
import tempfile
import time
from operator import itemgetter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pescheduler  # noqa: E402
from pescheduler import Application  # noqa: E402

LENGTH = struct.Struct("!I")
_TS = itemgetter("ts")


def replay(events: int, columnar: bool):
    """A ``replay`` source with the pool it makes when it opens: what the deployment sends."""
    import benchops

    source = benchops.Replay(events=events, columnar=columnar)
    source.pool = benchops.Replay.make_pool(min(events, 200_000), columnar)
    return source


def expected(events: int, columnar: bool) -> tuple[int, int]:
    """(count, sum of ts) of ``events`` replayed from the pool, as ``replay`` sends them."""
    source = replay(events, columnar)
    count = total = 0
    while (batch := source.read(1000)) is not None:
        count += len(batch)
        total += _checksum(batch)
    return count, total


def _checksum(batch) -> int:
    if isinstance(batch, list):
        return sum(map(_TS, batch))
    import pyarrow.compute as pc

    return pc.sum(batch.column("ts")).as_py()


# -- raw socket loop ------------------------------------------------------------------------
def _send(port: int, events: int, columnar: bool) -> None:
    """The sending process: connect, then pickle and send (or send the IPC bytes of) each batch."""
    from pescheduler.worker.channels import encode

    source = replay(events, columnar)
    frames = {id(b): bytes(encode(b, None)) for b in source.pool} if columnar else None
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (batch := source.read(1000)) is not None:
            body = frames[id(batch)] if columnar else pickle.dumps(batch, protocol=5)
            header = LENGTH.pack(len(body))
            sent = sock.sendmsg([header, body])            # one gathering send, no copy
            if sent < len(header) + len(body):
                rest = (header + body)[sent:] if sent < len(header) else memoryview(body)[sent - len(header):]
                sock.sendall(rest)


def _frames(sock: socket.socket):
    """Frame bodies off ``sock`` until it closes, read as a careful hand loop would: large
    receives into one buffer and frames parsed out of it (a view, no copy); a frame larger
    than the buffer goes into a buffer of its own."""
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    start = end = 0
    while True:
        while end - start < LENGTH.size or end - start < LENGTH.size + LENGTH.unpack_from(buf, start)[0]:
            if end - start >= LENGTH.size:
                length = LENGTH.unpack_from(buf, start)[0]
                if LENGTH.size + length > len(buf) // 2:            # large: its own buffer
                    body = bytearray(length)
                    have = end - start - LENGTH.size
                    body[:have] = view[start + LENGTH.size:end]
                    body_view = memoryview(body)
                    while have < length:
                        n = sock.recv_into(body_view[have:])
                        if not n:
                            raise ConnectionError("sender closed mid-frame")
                        have += n
                    start = end = 0
                    yield body
                    continue
            if len(buf) - end < len(buf) // 2:                     # compact
                buf[:end - start] = buf[start:end]
                start, end = 0, end - start
            n = sock.recv_into(view[end:])
            if not n:
                return
            end += n
        length = LENGTH.unpack_from(buf, start)[0]
        yield view[start + LENGTH.size:start + LENGTH.size + length]
        start += LENGTH.size + length


def raw_socket(events: int, columnar: bool) -> tuple[float, int, int]:
    """(seconds from the first frame to the last, tuples, ts sum) of the hand-written loop."""
    import pyarrow as pa

    ctx = multiprocessing.get_context("fork")
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = ctx.Process(target=_send, args=(server.getsockname()[1], events, columnar))
        sender.start()
        conn, _ = server.accept()
    count = total = 0
    t0 = None
    gc.disable()
    try:
        with conn:
            for body in _frames(conn):
                if t0 is None:
                    t0 = time.perf_counter()
                batch = (pa.ipc.open_stream(pa.py_buffer(body)).read_next_batch() if columnar
                         else pickle.loads(body))
                count += len(batch)
                total += _checksum(batch)
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
    sender.join(60)
    return elapsed, count, total


# -- pescheduler's channel ------------------------------------------------------------------------
def deployed(events: int, columnar: bool, rate: float | None = None) -> dict:
    """``replay`` -> ``throughput`` on two worker processes: the sink's record (count, first/last, ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        app = Application("channel")
        app.source("replay", events=events, columnar=columnar, stamp=rate is not None,
                   rate=rate).sink("throughput", path=path)
        with pescheduler.deploy(app, workers=2, plugins=["benchops"], policies=[]) as dep:
            assert len({pe.worker for pe in dep.placement().pes.values()}) == 2
            dep.wait(timeout=600)
        with open(path) as f:
            return json.load(f)


def check(label: str, count: int, total: int, want: tuple[int, int]) -> None:
    if (count, total) != want:
        print(f"{label}: received {count} tuples (ts sum {total}), sent {want[0]} (ts sum {want[1]})")
        sys.exit(1)


def measure(events: int, columnar: bool, repeat: int) -> tuple[float, float]:
    """Best tuples/s of (raw socket loop, pescheduler) over ``repeat`` interleaved rounds."""
    want = expected(events, columnar)
    raw = ours = 0.0
    for _ in range(repeat):
        elapsed, count, total = raw_socket(events, columnar)
        check("raw socket loop", count, total, want)
        raw = max(raw, count / elapsed)
        r = deployed(events, columnar)
        check("pescheduler channel", r["count"], r["ts_sum"], want)
        ours = max(ours, r["count"] / max(r["last"] - r["first"], 1e-9))
    return raw, ours


def latency(rate: float) -> tuple[float, float]:
    """Per-batch latency (ms, p50 and p99) of event dicts sent at ``rate`` tuples/s for about 5 s."""
    r = deployed(int(rate * 5), False, rate=rate)
    lat = sorted(x * 1000 for x in r["latencies"])
    return statistics.median(lat), lat[max(0, int(len(lat) * 0.99) - 1)]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=4_000_000, help="event dicts per run")
    parser.add_argument("--arrow-events", type=int, default=20_000_000, help="Arrow rows per run")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; the best of each counts")
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    parser.add_argument("--only", choices=["dicts", "arrow"], help="one part only (while working on it)")
    args = parser.parse_args()
    if args.quick:
        args.events, args.arrow_events, args.repeat = 400_000, 2_000_000, 1
    load = os.getloadavg()[0]
    lines = []
    if args.only != "arrow":
        raw, ours = measure(args.events, False, args.repeat)
        p50, p99 = latency(ours / 2)
        lines += [f"  event dicts, batches of 1,000:  raw socket + pickle {raw / 1e6:6.2f} M tuples/s   "
                  f"pescheduler {ours / 1e6:6.2f} M tuples/s = {ours / raw:.2f}x   (goal >= 2 M)",
                  f"    at half that rate: per-batch latency p50 {p50:.2f} ms, p99 {p99:.2f} ms (goal p99 <= 10 ms)"]
    if args.only != "dicts":
        raw_a, ours_a = measure(args.arrow_events, True, args.repeat)
        lines.append(f"  Arrow, 65,536 rows x 5 columns: raw socket (IPC bytes) {raw_a * 5 / 1e6:6.1f} M values/s   "
                     f"pescheduler {ours_a * 5 / 1e6:6.1f} M values/s = {ours_a / raw_a:.2f}x   (goal >= 50 M)")
    print(f"channel between two worker processes, output checked (count and ts sum); "
          f"load: {load:.1f} -> {os.getloadavg()[0]:.1f} (1-min, 2 cores shared)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
