"""latest, lookup and join_asof write a batch's state once (state.groups.write_batch): a key's
later tuples in the same batch read what its earlier ones wrote, and the backend sees one
write_many per batch, no put or delete per tuple (on memory a put is a Python call with three
stores: bench/keyed_operators.py)."""

from __future__ import annotations

from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators import Latest, Lookup
from pescheduler.operators.join_asof import AsofJoin
from pescheduler.state import MemoryState


class Calls(MemoryState):
    """The memory backend, noting each write call it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def put(self, key, value) -> None:
        self.calls.append("put")
        super().put(key, value)

    def delete(self, key) -> None:
        self.calls.append("delete")
        super().delete(key)

    def write_many(self, puts, deletes=()) -> None:
        puts, deletes = list(puts), list(deletes)
        self.calls.append(("write_many", sorted(k for k, _ in puts), sorted(deletes)))
        super().write_many(puts, deletes)


def _opened(op, attr: str) -> Calls:
    op.open(OperatorContext(op.name, pe_id="t", key_field="id", extra={"state": "memory"}))
    state = Calls()
    setattr(op, attr, state)
    return state


def test_latest_reads_its_own_batch_and_writes_it_once():
    op = Latest()
    state = _opened(op, "_rows")
    state.put(7, {"id": 7, "v": 0})
    state.calls.clear()
    out = Emitter()
    op.process([{"op": "insert", "id": 1, "after": {"id": 1, "v": "a"}},
                {"op": "update", "id": 1, "after": {"id": 1, "v": "b"}},
                {"op": "delete", "id": 7},
                {"op": "delete", "id": 1},
                {"op": "insert", "id": 1, "after": {"id": 1, "v": "c"}},
                {"op": "insert", "id": 2, "after": {"id": 2, "v": "d"}},
                {"op": "delete", "id": 2},
                {"op": "delete", "id": 2}], out)            # a key deleted twice: once
    assert [(o["op"], o["id"], o["previous"] and o["previous"]["v"]) for o in out] == [
        ("upsert", 1, None), ("upsert", 1, "a"), ("delete", 7, 0), ("delete", 1, "b"),
        ("upsert", 1, None), ("upsert", 2, None), ("delete", 2, "d")]
    assert state.calls == [("write_many", [1], [2, 7])]
    assert op.rows() == {1: {"id": 1, "v": "c"}}


def test_lookup_writes_a_batch_of_changes_once_and_its_events_read_them():
    op = Lookup(key="id")
    state = _opened(op, "_keys")
    out = Emitter()
    op.process_input(1, [{"op": "insert", "id": 1, "after": {"v": "a"}, "ts": 1},
                         {"op": "insert", "id": 2, "after": {"v": "b"}, "ts": 2},
                         {"op": "update", "id": 1, "after": {"v": "c"}, "ts": 3},
                         {"op": "delete", "id": 2, "ts": 4}], out)
    assert state.calls == [("write_many", [1], [2])]
    op.process_input(0, [{"id": 1, "ts": 5}, {"id": 2, "ts": 5}], out)
    assert [o["right"] for o in out] == [{"v": "c"}, None]
    assert state.calls == [("write_many", [1], [2])]         # a batch of events writes nothing


def test_join_asof_reads_what_its_watermark_pass_wrote_and_writes_it_once():
    op = AsofJoin(by="id", direction="nearest")
    state = _opened(op, "_keys")
    out = Emitter()
    op.process_input(1, [{"id": 1, "ts": 1, "r": "a"}, {"id": 2, "ts": 1, "r": "x"}], out)
    op.process_input(0, [{"id": 1, "ts": 2}, {"id": 1, "ts": 3}], out)
    op.process_input(1, [{"id": 1, "ts": 4, "r": "b"}], out)
    op.on_watermark(10, out)
    # each left waits (nearest), the right at 4 resolves both: 2 is nearer to 1, 3 to 4
    assert [(o["left"]["ts"], o["right"]["r"]) for o in out] == [(2, "a"), (3, "b")]
    assert state.calls == [("write_many", [1, 2], [])]
    assert dict(state.entries())[1][0] == (4, {"id": 1, "ts": 4, "r": "b"})
