"""Each graph transform on its own: fuse, split, move, and what they refuse."""

from __future__ import annotations

import pytest

from pescheduler import Application
from pescheduler.actions import ActionRefused, Fuse, Move, Release, Replicate, Split
from pescheduler.plan.compiler import compile_app
from pescheduler.plugins import load_plugins
from pescheduler.plan.routing import router_targets
from pescheduler.wire import KEY_GROUPS
from pescheduler.plan.transforms import NoSlotLeft, candidate_slots, least_loaded, routers_of, transform

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
    (Replicate("numbers-1", 1), "SINGLETON"),
    (Replicate("tag-2", 0), "copies must be >= 1"),
    (Replicate("nope", 1), "unknown operator"),
    (Replicate("tag-2", 1, routers=("tag-4",)), "do not feed"),
    (Release("tag-2", 1), "has 0 copies"),
])
def test_impossible_actions_are_refused_with_a_reason(placement, action, reason):
    with pytest.raises(ActionRefused, match=reason):
        transform(placement, action)


# -- copies on standard slots ---------------------------------------------------------

def test_compiler_lays_out_standard_slots_per_host(placement):
    # one host ("" here), pescheduler.standard.slots-per-host = 2, spread over its workers
    assert {s: (slot.worker, slot.copies) for s, slot in placement.slots.items()} == {
        "slot-1": ("tcp://a", ()), "slot-2": ("tcp://b", ())}


def test_replicate_puts_a_copy_on_a_slot_off_the_operators_worker(placement):
    new = transform(placement, Replicate("tag-2", 1))
    copy = new.pes["tag-2#1"]
    assert (copy.operators, copy.worker, copy.copy_of) == (("tag-2#1",), "tcp://a", "tag-2")
    assert new.slots["slot-1"].copies == ("tag-2#1",)
    assert new.plan.ops["tag-2#1"].copy_of == "tag-2" and new.instances("tag-2") == ["tag-2", "tag-2#1"]
    assert {e for e in new.plan.edges if "tag-2#1" in e} == {("numbers-1", "out", "tag-2#1"),
                                                            ("tag-2#1", "out", "tag-3")}
    assert new.routes["tag-2"].users == {"tag-2#1": ("numbers-1",)}
    assert placement.copies_of("tag-2") == []                    # the old placement is untouched


def test_candidate_lists_start_at_different_slots_per_operator(placement):
    assert candidate_slots(placement, "tag-2") == ["slot-1", "slot-2"]
    assert candidate_slots(placement, "tag-3") == ["slot-2", "slot-1"]


def test_no_slot_left_is_refused_so_a_cold_start_can_be_tried(placement):
    one = transform(placement, Replicate("tag-2", 1))
    with pytest.raises(NoSlotLeft, match="needs 1 standard slot"):
        transform(one, Replicate("tag-2", 1))      # slot-2 is on tag-2's own worker


def test_release_restores_the_placement_and_frees_the_slot(placement):
    back = transform(transform(placement, Replicate("tag-2", 1)), Release("tag-2", 1))
    assert back.plan.edges == placement.plan.edges and set(back.plan.ops) == set(placement.plan.ops)
    assert back.pes == placement.pes and back.slots == placement.slots and not back.routes


def test_weights_shared_and_exclusive_copies_of_an_operator_with_two_routers(placement):
    two = transform(placement, Replicate("tag-2", 1))            # tag-3 is now fed by tag-2 and tag-2#1
    assert routers_of(two, "tag-3") == ["tag-2", "tag-2#1"]
    new = transform(two, Replicate("tag-3", 1, routers=("tag-2",)))      # exclusive to tag-2
    route = new.routes["tag-3"]
    assert router_targets("tag-3", ["tag-3#1"], route, "tag-2", ["tag-2", "tag-2#1"]).weights == (1, 2)
    assert router_targets("tag-3", ["tag-3#1"], route, "tag-2#1", ["tag-2", "tag-2#1"]).instances == ("tag-3",)


def test_a_shared_copy_lives_until_its_last_router_releases_it(placement):
    two = transform(placement, Replicate("tag-2", 1))
    shared = transform(two, Replicate("tag-3", 1))
    assert shared.routes["tag-3"].users["tag-3#1"] == ("tag-2", "tag-2#1")
    one_left = transform(shared, Release("tag-3", routers=("tag-2",)))
    assert one_left.copies_of("tag-3") == ["tag-3#1"]
    assert one_left.routes["tag-3"].users["tag-3#1"] == ("tag-2#1",)
    slot = next(s for s in one_left.slots.values() if "tag-3#1" in s.copies)   # parameters kept
    gone = transform(one_left, Release("tag-3", routers=("tag-2#1",)))
    assert gone.copies_of("tag-3") == [] and all("tag-3#1" not in s.copies for s in gone.slots.values())
    assert slot.copies == ("tag-3#1",)


def test_keyed_copies_split_the_key_groups_evenly():
    app = Application("k")
    app.source("numbers").key_by("key").apply("running_sum").sink("print")
    pl = compile_app(app, load_plugins(["support_ops"]), WORKERS)
    new = transform(pl, Replicate("running_sum-3", 1))
    groups = new.routes["running_sum-3"].key_groups
    assert len(groups["running_sum-3"]) == len(groups["running_sum-3#1"]) == KEY_GROUPS // 2
    with pytest.raises(ActionRefused, match="KEYED"):
        transform(pl, Replicate("running_sum-3", 1, routers=("key_by-2",)))


# -- can_fuse: the one fusion rule ------------------------------------------------------------

def _diamond():
    """numbers-1 feeds tag-2 and tag-3 (both to print-4); tag-2 is copied."""
    app = Application("d")
    src = app.source("numbers")
    a, b = src.apply("tag", tag="a"), src.apply("tag", tag="b")
    a.sink("print")
    b.sink("print")
    placement = compile_app(app, load_plugins(["support_ops"]), ["tcp://a", "tcp://b", "tcp://c", "tcp://d", "tcp://e"],
                            {w: f"h-{w[-1]}" for w in ("tcp://a", "tcp://b", "tcp://c", "tcp://d", "tcp://e")})
    return transform(placement, Replicate("tag-2", 1))


def test_can_fuse_gives_the_first_guard_that_fails_and_the_fuse_transform_refuses_with_it():
    from pescheduler.plan.transforms import can_fuse

    pl = _diamond()
    assert can_fuse(pl, "nope", "tag-2") == f"unknown PE 'nope'; PEs are: {', '.join(pl.pes)}"
    assert can_fuse(pl, "tag-3", "tag-3") == "cannot fuse 'tag-3' with itself"
    assert can_fuse(pl, "tag-2#1", "tag-3") == "copies are released, not fused"
    assert can_fuse(pl, "tag-2", "tag-3") == ("'tag-2' has copies and would share its input channel with "
                                              "['tag-3']; release its copies first")
    assert can_fuse(pl, "tag-2", "print-4") is None and can_fuse(pl, "numbers-1", "tag-2") is None
    for a, b in (("tag-3", "tag-3"), ("tag-2#1", "tag-3"), ("tag-2", "tag-3")):
        with pytest.raises(ActionRefused) as refused:
            transform(pl, Fuse(a, b))
        assert str(refused.value) == can_fuse(pl, a, b)


def test_the_compiler_fuses_only_what_can_fuse_allows(monkeypatch):
    from pescheduler.plan import compiler

    app = Application("t")
    app.source("numbers").apply("tag", tag="1").apply("tag", tag="2").sink("print")
    plugins = load_plugins(["support_ops"])
    assert list(compile_app(app, plugins, ["tcp://a", "tcp://b"]).pes) == ["numbers-1", "tag-2->tag-3->print-4"]
    # refuse fusing into the sink's PE: the edge nearest the sink is skipped, the next one fused
    monkeypatch.setattr(compiler, "can_fuse", lambda pl, a, b: "no" if "print-4" in (a, b) else None)
    assert list(compile_app(app, plugins, ["tcp://a", "tcp://b"]).pes) == ["numbers-1->tag-2->tag-3", "print-4"]


def test_workers_join_and_leave_and_slots_are_added_after_the_highest_id(placement):
    from pescheduler.plan.transforms import add_slot, add_workers, remove_workers, with_slots

    grown = add_workers(placement, {"tcp://d": "hd", "tcp://a": "elsewhere"})
    assert grown.workers == (*WORKERS, "tcp://d") and grown.hosts["tcp://d"] == "hd"
    assert grown.hosts.get("tcp://a") == placement.hosts.get("tcp://a")        # already in: unchanged
    slotted = add_slot(with_slots(grown, 1), "tcp://d")
    assert slotted.slots[f"slot-{len(slotted.slots)}"].worker == "tcp://d"
    assert slotted.slots[f"slot-{len(slotted.slots)}"].host == "hd"
    fenced = remove_workers(slotted, {"tcp://d"})
    assert "tcp://d" not in fenced.workers and "tcp://d" not in fenced.hosts
    assert all(s.worker != "tcp://d" for s in fenced.slots.values()) and fenced.pes == slotted.pes
    added = add_slot(fenced, "tcp://a").slots.keys() - fenced.slots.keys()
    assert len(added) == 1 and int(added.pop().rsplit("-", 1)[1]) > max(
        int(k.rsplit("-", 1)[1]) for k in fenced.slots)                          # numbered after the highest
