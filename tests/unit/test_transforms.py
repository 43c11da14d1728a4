"""Each graph transform on its own: fuse, split, move, and what they refuse."""

from __future__ import annotations

import pytest

from pescheduler import Application
from pescheduler.actions import ActionRefused, Fuse, Move, Replicate, Split
from pescheduler.compiler import compile_app
from pescheduler.plugins import load_plugins
from pescheduler.transforms import least_loaded, transform

WORKERS = ["tcp://a", "tcp://b", "tcp://c"]


@pytest.fixture(scope="module")
def placement():
    app = Application("t")
    app.source("numbers").apply("tag", tag="1").apply("tag", tag="2").apply("tag", tag="3").sink("print")
    return compile_app(app, load_plugins(["support_ops"]), WORKERS)


def ops_of(placement):
    return {pe_id: pe.operators for pe_id, pe in placement.pes.items()}


def test_initial_placement(placement):
    assert ops_of(placement) == {"numbers-1": ("numbers-1",), "tag-2": ("tag-2",),
                                 "tag-3->tag-4->print-5": ("tag-3", "tag-4", "print-5")}


def test_fuse_adjacent_keeps_first_worker_and_names_by_operators(placement):
    new = transform(placement, Fuse("tag-2", "tag-3->tag-4->print-5"))
    assert ops_of(new)["tag-2->tag-3->tag-4->print-5"] == ("tag-2", "tag-3", "tag-4", "print-5")
    assert new.pes["tag-2->tag-3->tag-4->print-5"].worker == "tcp://b"
    assert "tag-2" not in new.pes


def test_fuse_non_adjacent(placement):
    new = transform(placement, Fuse("numbers-1", "tag-3->tag-4->print-5"))
    assert ops_of(new)["numbers-1->tag-3->tag-4->print-5"] == ("numbers-1", "tag-3", "tag-4", "print-5")
    assert set(new.channels()) == {("numbers-1", "out", "tag-2", "tag-2"),
                                   ("tag-2", "out", "tag-3", "numbers-1->tag-3->tag-4->print-5")}


def test_split_to_least_loaded_worker(placement):
    fused = transform(placement, Fuse("tag-2", "tag-3->tag-4->print-5"))
    assert least_loaded(fused) == "tcp://c"
    new = transform(fused, Split("tag-2->tag-3->tag-4->print-5", ("tag-4", "print-5")))
    assert ops_of(new) == {"numbers-1": ("numbers-1",), "tag-2->tag-3": ("tag-2", "tag-3"),
                           "tag-4->print-5": ("tag-4", "print-5")}
    assert new.pes["tag-4->print-5"].worker == "tcp://c"


def test_split_then_fuse_moves_part_of_a_hot_pe_to_a_cold_one(placement):
    step = transform(placement, Split("tag-3->tag-4->print-5", ("tag-3",), worker="tcp://c"))
    new = transform(step, Fuse("tag-2", "tag-3"))
    assert ops_of(new)["tag-2->tag-3"] == ("tag-2", "tag-3")
    assert ops_of(new)["tag-4->print-5"] == ("tag-4", "print-5")


def test_move(placement):
    new = transform(placement, Move("numbers-1", "tcp://c"))
    assert new.pes["numbers-1"].worker == "tcp://c"
    assert placement.pes["numbers-1"].worker == "tcp://a"        # the old placement is untouched


@pytest.mark.parametrize("action, reason", [
    (Fuse("nope", "tag-2"), "unknown PE 'nope'"),
    (Fuse("tag-2", "tag-2"), "with itself"),
    (Split("tag-2", ()), "at least one operator"),
    (Split("tag-3->tag-4->print-5", ("tag-2",)), "not in PE"),
    (Split("tag-3->tag-4->print-5", ("tag-3", "tag-4", "print-5")), "is a Move"),
    (Split("tag-3->tag-4->print-5", ("tag-3",), worker="tcp://gone"), "not in the cluster"),
    (Move("tag-2", "tcp://gone"), "not in the cluster"),
    (Move("tag-2", "tcp://b"), "already runs on"),
    (Replicate("tag-2", 1), "not a placement transform"),
])
def test_impossible_actions_are_refused_with_a_reason(placement, action, reason):
    with pytest.raises(ActionRefused, match=reason):
        transform(placement, action)
