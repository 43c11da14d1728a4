"""A columnar source's 10 k-row reads reach the chain as the framework's batches (worker/gather.py
hooked into the source driver): one pump, one batch, the watermark after all of it, the end after."""

from __future__ import annotations

import pyarrow as pa

from pescheduler import Source
from pescheduler.testing import CollectingOutput, RunResult
from pescheduler.worker.chain import Chain
from pescheduler.worker.source_driver import SourceDriver, pump


class Small(Source):
    """Arrow batches of ``rows`` rows, all ready at once, as a source of small batches delivers."""

    name = "small"
    columnar = True

    def __init__(self, batches: int, rows: int):
        super().__init__(ts_field="ts", max_delay=0)
        self.todo = [pa.RecordBatch.from_arrays([pa.array(range(i * rows, (i + 1) * rows), pa.int64())], ["ts"])
                     for i in range(batches)]

    def read(self, n):
        return self.todo.pop(0) if self.todo else None


class Batches(CollectingOutput):
    """The chain's output port: each batch's size as it came, besides its rows."""

    def __init__(self, result):
        super().__init__(result)
        self.sizes = []

    def send(self, batch):
        self.sizes.append(len(batch))
        super().send(batch)


def test_ready_small_arrow_reads_reach_the_chain_as_one_batch_then_the_end():
    source = Small(batches=8, rows=10_000)
    result = RunResult()
    out = Batches(result)
    chain = Chain({"src": source}, [], {("src", "out"): [out]})
    driver = SourceDriver("src", source, 1000)
    driver.gather.budget_s = 60          # the reads' time bound out of the way: a loaded machine may pause us
    assert pump(driver, chain) == 70_000 and out.sizes == [70_000]       # up to 65,536 rows, in one
    assert result.watermarks == [69_998]                                   # after every row of it (ts <= 69,999)
    assert pump(driver, chain) == 10_000 and out.sizes == [70_000, 10_000]
    assert pump(driver, chain) is None and result.ended
    assert [r["ts"] for r in result.output] == list(range(80_000))


def test_the_gathers_read_budget_follows_the_deployments_latency_target():
    from pescheduler import config
    from pescheduler.wire import PESpec
    from pescheduler.worker.runtime import Hosting, PERunner

    def budget(latency_s):
        spec = PESpec("pe", "dep", {"src": (Small, {"batches": 1, "rows": 1}, None)}, [], latency_s=latency_s)
        return PERunner(spec, Hosting(worker="w")).sources[0].gather.budget_s

    assert budget(0.010) == 0.005 and budget(0.002) == 0.001     # half the target, as a channel's fill
    assert SourceDriver("src", Small(1, 1), 1000).gather.budget_s == config.get_seconds("batch.latency") / 2
    source = Small(batches=3, rows=10)
    result = RunResult()
    driver = SourceDriver("src", source, 1000, latency_s=0)      # "never wait": each read goes alone
    assert pump(driver, Chain({"src": source}, [], {("src", "out"): [CollectingOutput(result)]})) == 10
