"""The one source pump: a read moved into a chain, as the PE loop, ``testing`` and ``ep`` use it."""

from __future__ import annotations

from pescheduler import Source
from pescheduler.operators.basic import Map
from pescheduler.testing import CollectingOutput, RunResult
from pescheduler.worker.chain import Chain
from pescheduler.worker.source_driver import SourceDriver, pump


class Trickle(Source):
    """Hands out prepared reads in turn: a batch, ``[]`` (nothing ready) or ``None`` (the end);
    rejects the item ``"bad"`` instead of emitting it."""

    name = "trickle"

    def __init__(self, reads):
        super().__init__(ts_field="ts", max_delay=0)
        self.reads = list(reads)

    def read(self, n):
        batch = self.reads.pop(0)
        if batch is None:
            return None
        good = []
        for item in batch:
            (self.reject(item, "not an event") if item == "bad" else good.append(item))
        return good


def _chain(source):
    result = RunResult()
    chain = Chain({"src": source, "double": Map(lambda t: {**t, "x": t["x"] * 2})},
                  [("src", "out", "double")], {("double", "out"): [CollectingOutput(result)]})
    return chain, result


def test_a_pump_emits_a_batch_then_its_watermark_and_says_how_many_tuples_went():
    source = Trickle([[{"x": 1, "ts": 10}, {"x": 2, "ts": 30}], [], None])
    chain, result = _chain(source)
    driver = SourceDriver("src", source, 100)
    assert pump(driver, chain) == 2
    assert result.output == [{"x": 2, "ts": 10}, {"x": 4, "ts": 30}] and result.watermarks == [29]
    assert pump(driver, chain) == 0 and result.watermarks == [29]     # nothing ready: no new watermark
    assert not result.ended
    assert pump(driver, chain) is None and result.ended and driver.ended


def test_rejected_input_becomes_a_dead_letter_of_the_source_and_the_rest_goes_on():
    source = Trickle([[{"x": 1, "ts": 1}, "bad"], None])
    chain, result = _chain(source)
    driver = SourceDriver("src", source, 100)
    assert pump(driver, chain) == 1
    [dead] = chain.dead_letters
    assert dead.item == "bad" and dead.operator == "src" and chain.nodes["src"].stats.dead_letters == 1
    assert result.output == [{"x": 2, "ts": 1}]
