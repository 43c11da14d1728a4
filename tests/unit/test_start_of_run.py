"""The start of a run adds no latency of its own (issue 34: bench/latency.py's p99 at 50 % of capacity
was set by three things at the start, each checked here on the runtime's own parts):

- the first frame of 64 KiB or more imported pyarrow on the event loop (channels.frame_buffer);
- a paced source's pace counted from the driver's creation, so the first reads burst (source_driver.py);
- sources read before the PE's output channels were open, their tuples waiting for the connection
  (flow.InputScheduler.opening);
- a columnar pipeline's window imported its Arrow panes' module inside its first batch (window.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from pescheduler.operators.sources import IterableSource
from pescheduler.worker import source_driver
from pescheduler.worker.channels import DATA, ChannelIn, Inbox
from pescheduler.worker.runtime import Hosting, PERunner
from pescheduler.wire import OutputSpec, PESpec

HERE = "127.0.0.1:1"


def fresh_python(code: str) -> list[str]:
    """The first two lines ``code`` prints in a new interpreter (nothing imported yet)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split("\n")[:2]


def test_a_large_frame_imports_no_pyarrow_on_the_event_loop():
    """A worker that has not imported pyarrow gets a plain buffer for a large frame: the import
    (100+ ms under load) would land in the run, on the loop. Once pyarrow is imported (the first
    Arrow batch decoded), large frames come from Arrow's pool again (test_handshake checks it)."""
    code = (
        "import sys\n"
        "from pescheduler.worker.channels import frame_buffer\n"
        "assert 'pyarrow' not in sys.modules, 'imported before the frame'\n"
        "buf = frame_buffer(1 << 20)\n"
        "buf[:3] = b'abc'\n"
        "print(len(buf), 'pyarrow' in sys.modules)\n"
        "import pyarrow\n"
        "print(type(frame_buffer(1 << 20).obj).__name__)\n"
    )
    first, pooled = fresh_python(code)
    assert first == "1048576 False", "a large frame imported pyarrow"
    assert pooled == "Buffer", "with pyarrow imported, Arrow's pool"


def test_a_window_opened_where_arrow_batches_come_imports_its_columnar_panes_at_open():
    """A PE with a columnar source has imported pyarrow (source_driver) before its operators open:
    its window then imports the columnar panes' module at open, not inside the run's first batch
    (10-20 ms there on one worker, bench/columnar.py, issue 34). A row pipeline, with no pyarrow,
    imports neither."""
    code = (
        "import sys\n"
        "from pescheduler.operator import OperatorContext\n"
        "from pescheduler.operators.window import Window\n"
        "def opened():\n"
        "    w = Window(size='60s', aggregates={'avg_speed': ('avg', 'speed')})\n"
        "    w.open(OperatorContext(op_id='window-1', pe_id='pe', key_field='car'))\n"
        "    return 'pescheduler.operators.columnar_window' in sys.modules\n"
        "print(opened(), 'pyarrow' in sys.modules)\n"
        "import pyarrow\n"
        "print(opened())\n"
    )
    rows, columnar = fresh_python(code)
    assert rows == "False False", "a row pipeline's window imported Arrow"
    assert columnar == "True", "the columnar panes are imported in the first Arrow batch, not at open"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_paced_source_keeps_its_rate_from_its_first_read_not_from_its_creation(monkeypatch):
    """The PE is built, then its channels open and it starts (tens of ms, more under load): counted
    from the driver's creation, the first reads were behind schedule and went all at once."""
    clock = FakeClock()
    monkeypatch.setattr(source_driver, "perf_counter", clock)
    items = [{"n": i, "ts": i} for i in range(10_000)]
    driver = source_driver.SourceDriver("src", IterableSource(items, rate=1_000), 1000)
    clock.now += 0.5                                   # the PE's start
    burst = 0
    while driver.delay() == 0 and burst < 10_000:      # what the PE loop reads at once
        burst += len(driver.read())
    assert burst == driver.batch_size == 10, "one batch of 10 ms at 1 k/s, not half a second's worth"
    delivered = burst
    for _ in range(1000):                              # one second of the loop at 1 ms turns
        clock.now += 0.001
        while driver.delay() == 0:
            delivered += len(driver.read())
    assert 1000 <= delivered <= 1010, "the first second delivers the rate"
    assert driver.snapshot()["elapsed"] == pytest.approx(1.0)


def _pe_with_late_receiver():
    """A PE whose source feeds a channel to a PE on this worker not built yet (``expect`` waits)."""
    spec = PESpec("src", "dep", {"src": (WatchedSource, {"items": [{"n": i, "ts": i} for i in range(50)]}, None)},
                  [], outputs=[OutputSpec("c-w", "src", "out", "pe-w", HERE, HERE, ("w",))], batch_size=10)
    return PERunner(spec, Hosting("tcp://src"))


class WatchedSource(IterableSource):
    """Notes, at each read, whether its PE's output channels were open."""

    outs: list = []
    seen: list = []

    def read(self, n):
        self.seen.append(all(channel.opening is None for _spec, channel in self.outs))
        return super().read(n)


def test_a_source_reads_only_once_its_output_channels_are_open():
    """Started while its output channel still opens, the PE's source reads nothing until it is
    open, then everything goes (the PE is woken by the opening's credit)."""
    async def scenario():
        inbox, receiver = Inbox(), ChannelIn("c-w", "src", "out")
        arrived = asyncio.get_running_loop().create_future()

        def not_yet(_cid):
            raise KeyError(_cid)

        async def expect(_cid):
            return await arrived

        pe = _pe_with_late_receiver()
        WatchedSource.outs, WatchedSource.seen = pe.ports.outs, []
        pe.open_outputs(not_yet, HERE, expect)
        task = pe.start()
        asyncio.get_running_loop().call_later(0.2, arrived.set_result, (inbox, receiver))
        async with asyncio.timeout(30):
            await pe.opened()
            await task
        assert pe.state == "finished", pe.error
        assert WatchedSource.seen and all(WatchedSource.seen), "a read before the output channel was open"
        assert sum(len(b) for c, kind, b in inbox.items if kind == DATA) == 50
    asyncio.run(scenario())


def test_an_output_channel_that_cannot_open_fails_the_pe_with_why():
    async def scenario():
        def not_yet(_cid):
            raise KeyError(_cid)

        async def expect(_cid):
            raise KeyError(f"no receiver for {_cid!r} here")

        pe = _pe_with_late_receiver()
        WatchedSource.outs, WatchedSource.seen = pe.ports.outs, []
        pe.open_outputs(not_yet, HERE, expect)
        async with asyncio.timeout(30):
            await pe.start()
        assert pe.state == "failed" and WatchedSource.seen == []
        assert "wait for output channel 'c-w', which could not open" in pe.error, pe.error
    asyncio.run(scenario())
