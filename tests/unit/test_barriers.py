"""One PE's side of a checkpoint (worker/barriers.py), driven directly with the parts it is given
(operators, source drivers, aligner, ports, turns): no PE runner around it."""

from __future__ import annotations

import cloudpickle
import pytest

from pescheduler.errors import DeliveryFailed
from pescheduler.operator import CommitHooks, Sink, Source
from pescheduler.wire import InputSpec, PESpec
from pescheduler.worker.aligner import Aligner
from pescheduler.worker.barriers import Barriers, barrier
from pescheduler.worker.channels import DATA
from pescheduler.worker.ports import Ports
from pescheduler.worker.source_driver import Sources
from pescheduler.worker.turns import Turns


class Offsets(Source):
    """A source at a durable offset."""

    name = "offsets"

    def __init__(self) -> None:
        super().__init__()
        self.offset = 7

    def read(self, n):
        return []

    def position(self):
        return self.offset


class Staging(Sink, CommitHooks):
    """A sink that notes the hooks it gets; ``fail``: its commit raises."""

    name = "staging"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self.fail = False

    def process(self, batch):
        return []

    def pre_commit(self, checkpoint_id):
        self.calls.append(("pre_commit", checkpoint_id))

    def commit(self, checkpoint_id):
        if self.fail:
            raise OSError("the store is gone")
        self.calls.append(("commit", checkpoint_id))

    def abort(self, checkpoint_id):
        self.calls.append(("abort", checkpoint_id))


class Parts:
    """The parts a PE gives its Barriers, kept at hand for the test to look at."""

    def __init__(self, epoch: int = 1) -> None:
        self.ops = {"src": Offsets(), "sink": Staging()}
        self.sources = Sources(self.ops, 100)
        self.aligner = Aligner()
        self.ports = Ports(PESpec("pe", "d", {}, [], inputs=[InputSpec("c-a", "a", "out")]), None, lambda *d: None)
        self.changes = 0
        self.barriers = Barriers("pe", epoch, self.ops, self.sources, self.aligner, self.ports,
                                 Turns("pe", 0.05), lambda: {"sink": {"state": "staged"}}, self._changed)

    def _changed(self) -> None:
        self.changes += 1


def test_a_pe_that_no_longer_moves_snapshots_at_once_with_its_source_positions():
    parts = Parts()
    assert not parts.barriers.begin(3, moving=False), "no alignment to check"
    result = parts.barriers.results[3]
    assert cloudpickle.loads(result["state"]) == {"sink": {"state": "staged"}}
    assert result["positions"] == {"src": 7} and parts.ops["sink"].calls == [("pre_commit", 3)]
    assert parts.changes == 1 and parts.barriers.current is None
    assert not parts.barriers.begin(3, moving=False) and parts.ops["sink"].calls == [("pre_commit", 3)], \
        "a checkpoint taken here is over: its barrier again changes nothing"


def test_a_barrier_pauses_the_sources_parks_its_channel_and_the_alignment_puts_the_input_back_first():
    parts = Parts()
    channel = parts.ports.receivers["c-a"]
    assert parts.barriers.arrived(channel, barrier(4, 1), moving=True)
    assert parts.aligner.marker == barrier(4, 1) and all(d.paused for d in parts.sources)
    assert parts.aligner.park(channel, DATA, [{"n": 1}]), "after the barrier: the next checkpoint's"
    parts.ports.inbox.put(channel, DATA, [{"n": 2}])
    parts.barriers.aligned()
    assert 4 in parts.barriers.results and parts.barriers.current is None and parts.aligner.marker is None
    assert [p for _c, _k, p in parts.ports.inbox.items] == [[{"n": 1}], [{"n": 2}]]
    assert not any(d.paused for d in parts.sources) and parts.ports.inbox.event.is_set()


def test_barriers_older_than_the_pe_or_behind_a_reconfiguration_take_nothing():
    parts = Parts(epoch=2)
    channel = parts.ports.receivers["c-a"]
    assert not parts.barriers.arrived(channel, barrier(5, 1), moving=True), "begun before this PE existed"
    assert parts.aligner.marker is None
    parts.aligner.begin("reconf-m1", lambda op_id: None)
    assert not parts.barriers.begin(6, 2) and parts.barriers.done_upto == 6
    assert parts.aligner.marker == "reconf-m1" and not parts.barriers.results


def test_settling_commits_a_complete_checkpoint_aborts_one_that_failed_and_a_failed_commit_fails_the_pe():
    parts = Parts()
    sink = parts.ops["sink"]
    parts.barriers.begin(1, moving=False)
    parts.barriers.settle(1, complete=True)
    assert sink.calls[-1] == ("commit", 1)
    assert parts.barriers.begin(2, 1)
    parts.barriers.settle(2, complete=False)
    assert parts.barriers.current is None and parts.aligner.marker is None, "the alignment on 2 ends"
    assert ("abort", 2) not in sink.calls, "what 2 staged goes out with the next complete checkpoint"
    sink.fail = True
    with pytest.raises(DeliveryFailed, match="committing checkpoint 3 failed: OSError"):
        parts.barriers.settle(3, complete=True)
    with pytest.raises(DeliveryFailed):
        parts.barriers.check()
