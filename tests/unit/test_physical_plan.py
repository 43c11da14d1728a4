"""The physical plan: operator instances from one copy map, the operator -> PE index, PE ids."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from pescheduler import Application, Placement
from pescheduler.actions import Fuse, Release, Replicate
from pescheduler.plan.compiler import compile_app
from pescheduler.plan.placement import PhysicalPlan, named_operators, pe_name
from pescheduler.plan.transforms import transform
from pescheduler.plugins import load_plugins

WORKERS = ["tcp://a", "tcp://b", "tcp://c"]


@pytest.fixture(scope="module")
def placement():
    app = Application("t")
    app.source("numbers").apply("tag", tag="1").apply("tag", tag="2").sink("print")
    return compile_app(app, load_plugins(["support_ops"]), WORKERS, {w: f"host-{w[-1]}" for w in WORKERS})


def test_placement_is_the_physical_plan_and_the_logical_plan_holds_no_copies(placement):
    assert Placement is PhysicalPlan
    copied = transform(placement, Replicate("tag-2", 2))
    assert dict(copied.copies) == {"tag-2#1": "tag-2", "tag-2#2": "tag-2"}
    assert list(copied.logical.ops) == list(placement.logical.ops) == ["numbers-1", "tag-2", "tag-3", "print-4"]
    assert not any(hasattr(op, "copy_of") for op in copied.logical.ops.values())


def test_instances_and_their_edges_come_from_the_copy_map(placement):
    copied = transform(placement, Replicate("tag-2", 2))
    ops = copied.plan.ops
    assert list(ops) == ["numbers-1", "tag-2", "tag-2#1", "tag-2#2", "tag-3", "print-4"]
    assert ops["tag-2#2"].copy_of == "tag-2" and ops["tag-2#2"].op is ops["tag-2"].op
    assert ops["tag-2"].copy_of is None and copied.original("tag-2#1") == "tag-2"
    assert copied.instances("tag-2") == ["tag-2", "tag-2#1", "tag-2#2"]
    assert {e for e in copied.plan.edges if "#" in e[0] + e[2]} == {
        ("numbers-1", "out", "tag-2#1"), ("numbers-1", "out", "tag-2#2"),
        ("tag-2#1", "out", "tag-3"), ("tag-2#2", "out", "tag-3")}
    released = transform(copied, Release("tag-2", 2))
    assert not released.copies and released.plan.edges == placement.plan.edges


def test_pe_of_is_an_index_over_every_instance(placement):
    copied = transform(transform(placement, Fuse("tag-2", "tag-3->print-4")), Replicate("tag-3", 1))
    assert copied.pe_of("tag-3") == "tag-2->tag-3->print-4" and copied.pe_of("tag-3#1") == "tag-3#1"
    with pytest.raises(KeyError, match="in no PE"):
        copied.pe_of("nope")


def test_a_pe_id_is_its_operators_and_unknown_ids_are_read_against_the_plan_not_split():
    plan = PhysicalPlan(_plan("src", "a->b", "a", "b->c"), MappingProxyType({})).plan
    assert pe_name(plan, ["b->c", "src"]) == "src->b->c"
    assert named_operators(plan, "src->b->c") == ("src", "b->c")      # an id containing "->" stays whole
    assert named_operators(plan, "a->b->c") == ("a", "b->c")         # "a->b" then "c" names nothing
    assert named_operators(plan, "x->y") == ()


def test_pe_operators_names_the_operators_of_a_pe_a_fuse_would_make(placement):
    assert placement.pe_operators("tag-3->print-4") == ("tag-3", "print-4")      # exists
    assert placement.pe_operators("tag-2->tag-3->print-4") == ("tag-2", "tag-3", "print-4")   # not yet
    assert placement.pe_operators("whatever") == ("whatever",)


def _plan(*op_ids):
    from pescheduler.plan.placement import LogicalOp, LogicalPlan
    from support_ops import Tag

    ops = {o: LogicalOp(o, "operator", "tag", Tag, MappingProxyType({}), ()) for o in op_ids}
    return LogicalPlan("t", MappingProxyType(ops), ())
