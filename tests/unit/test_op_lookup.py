"""Lookup join: static tables, a changelog as it is on arrival, and as of each event's time against
the backward as-of reference (the last change of the key at or before the event)."""

import json
import pickle

import pytest
from hypothesis import given, settings, strategies as st
from support_ops import merge_asof
from test_op_join import numbered
from test_op_join_asof import on_time

from pescheduler import Application
from pescheduler.errors import InvalidApplication
from pescheduler.operator import Emitter, OperatorContext
from pescheduler.operators.lookup import Lookup

change = st.fixed_dictionaries({"k": st.integers(0, 2), "ts": st.integers(0, 20),
                                "op": st.sampled_from(["insert", "update", "upsert", "delete"])})
event = st.fixed_dictionaries({"k": st.integers(0, 2), "ts": st.integers(0, 20)})
step = st.one_of(st.tuples(st.just("L"), st.lists(event, max_size=6)),
                 st.tuples(st.just("R"), st.lists(change, max_size=6)),
                 st.tuples(st.just("W"), st.integers(0, 4)))


def as_change(c):
    """A change of the generated kind, its row naming the change (``None`` for a delete)."""
    row = {"v": c["id"]}
    return {**c, "after": row} if c["op"] in ("insert", "update") else {**c, "row": row}


def feed(op, steps):
    out = Emitter()
    for kind, arg in steps:
        if kind == "W":
            op.on_watermark(arg, out)
        else:
            op.process_input(0 if kind == "L" else 1, [as_change(c) if kind == "R" else c for c in arg], out)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=30), st.integers(0, 30))
def test_as_of_is_the_last_change_at_or_before_the_event(steps, cut):
    steps = numbered(steps)
    first = Lookup(key="k", as_of=True)
    head = feed(first, steps[:cut])
    second = Lookup(key="k", as_of=True)            # a restore mid-stream changes nothing
    second.restore(pickle.loads(pickle.dumps(first.snapshot())))
    out = head + feed(second, steps[cut:])
    events, changes, _ = on_time(steps)
    ops = {c["id"]: c["op"] for c in changes}
    want = {i: (None if m is None or ops[m] == "delete" else m)
            for i, m in merge_asof(events, changes, None, "backward").items()}
    assert sorted((r["left"]["id"], r["right"] and r["right"]["v"]) for r in out) == sorted(
        want.items(), key=lambda kv: (kv[0], kv[1] is None))


def test_changelog_as_it_is_on_arrival():
    op, out = Lookup(key="id"), Emitter()
    op.process_input(0, [{"id": 1, "ts": 5}], out)                           # no row yet
    op.process_input(1, [{"op": "insert", "id": 1, "after": {"tier": "gold"}, "ts": 9},
                         {"op": "upsert", "id": 2, "row": {"tier": "blue"}},
                         {"op": "truncate", "id": 2}], out)
    op.process_input(0, [{"id": 1, "ts": 1}, {"id": 2, "ts": 2}], out)      # rows of the moment
    op.process_input(1, [{"op": "delete", "id": 1, "ts": 10}], out)
    op.process_input(0, [{"id": 1, "ts": 11}], out)
    assert [(r["left"]["ts"], r["right"]) for r in out] == [
        (5, None), (1, {"tier": "gold"}), (2, {"tier": "blue"}), (11, None)]
    assert [d.item["op"] for d in out.dead] == ["truncate"]              # dead-lettered, the rest goes on


def test_static_rows_and_file(tmp_path):
    rows = [{"cid": 1, "tier": "gold"}, {"cid": 2, "tier": "blue"}]
    path = tmp_path / "customers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for op in (Lookup(key="customer", rows=iter(rows), table_key="cid"),
               Lookup(key="customer", path=str(path), table_key="cid")):
        op.open(OperatorContext(op_id="lookup-2"))
        out = Emitter()
        op.process_input(0, [{"customer": 2, "ts": 1}, {"customer": 3, "ts": 2}, {"ts": 3}], out)
        assert [r["right"] for r in out] == [{"cid": 2, "tier": "blue"}, None]
        assert len(out.dead) == 1                                           # no key: dead-lettered


def test_stream_method_and_bad_arguments():
    app = Application("lookup")
    orders = app.source("iterable", items=[])
    customers = app.source("iterable", items=[])
    enriched = orders.lookup(customers.key_by("id").latest(), key="customer_id", table_key="id", as_of=True)
    node = app.nodes[enriched.op_id]
    assert (node.name, node.key_field, node.params) == ("lookup", "customer_id",
                                                        {"key": "customer_id", "as_of": True, "on": "ts"})
    renamed = app.nodes[node.inputs[1][0]]
    assert renamed.name == "map" and set(renamed.params) == {"customer_id"}   # the table keyed as the events
    static = app.nodes[orders.lookup([{"id": 1}], key="id").op_id]
    assert static.params["rows"] == [{"id": 1}] and len(static.inputs) == 1
    keyed = app.nodes[orders.key_by("id").lookup([{"id": 1}]).op_id]     # the key of the key_by
    assert (keyed.params["key"], keyed.key_field) == ("id", "id")
    for unkeyed in (lambda: orders.lookup([]), lambda: orders.join_asof(customers)):
        with pytest.raises(InvalidApplication, match="needs a key"):
            unkeyed()
    with pytest.raises(ValueError, match="as_of=True needs a changelog"):
        Lookup(key="id", rows=[], as_of=True)
    with pytest.raises(ValueError, match="not both"):
        Lookup(key="id", rows=[], path="x.jsonl")
