"""Each compiler phase on its own: validate, annotate, fuse, place."""

from __future__ import annotations

import logging

import pytest

from pescheduler import Application
from pescheduler.plan.compiler import PHASES, CompileContext, annotate, compile_app, fuse, place, validate
from pescheduler.errors import InvalidApplication
from pescheduler.plugins import load_plugins


@pytest.fixture(scope="module")
def plugins():
    return load_plugins(["support_ops"])


def ctx(plugins, n_workers=3):
    workers = tuple(f"tcp://w{i}" for i in range(n_workers))
    return CompileContext(plugins, workers, {w: "h0" for w in workers})


def chain_app(n_tags=3):
    app = Application("chain")
    s = app.source("numbers", count=10)
    for i in range(n_tags):
        s = s.apply("tag", tag=str(i))
    s.key_by("key").apply("running_sum").sink("print")
    return app


def test_phases_are_the_documented_list():
    assert [name for name, _ in PHASES] == ["validate", "annotate", "fuse", "place"]


def test_validate_orders_topologically_and_lists_edges(plugins):
    plan = validate(chain_app(2), ctx(plugins))
    assert plan.order == ["numbers-1", "tag-2", "tag-3", "key_by-4", "running_sum-5", "print-6"]
    assert ("tag-2", "out", "tag-3") in plan.edges


def test_unknown_operator_lists_known_names(plugins):
    app = Application("bad")
    app.source("numbers").apply("no_such_op").sink("print")
    with pytest.raises(InvalidApplication) as err:
        validate(app, ctx(plugins))
    assert "no_such_op" in str(err.value) and "tag" in str(err.value)


def test_bad_parameter_names_the_operator(plugins):
    # Caught while building when the plug-in is already active, else when validating.
    with pytest.raises(InvalidApplication, match="tag.*colour"):
        app = Application("bad")
        app.source("numbers").apply("tag", colour="red").sink("print")
        validate(app, ctx(plugins))


def test_app_without_sink_says_how_to_add_one(plugins):
    app = Application("nosink")
    app.source("numbers").apply("tag")
    with pytest.raises(InvalidApplication, match=r"no sink.*\.sink\("):
        validate(app, ctx(plugins))


def test_unused_output_is_an_error(plugins):
    app = Application("dangling")
    s = app.source("numbers")
    s.sink("print")
    s.apply("tag")
    with pytest.raises(InvalidApplication, match="tag-3 is not used"):
        validate(app, ctx(plugins))


def test_annotate_hands_key_field_to_keyed_operator(plugins):
    plan = annotate(validate(chain_app(1), ctx(plugins)), ctx(plugins))
    assert plan.ops["running_sum-4"].key_field == "key"
    assert plan.ops["tag-2"].key_field is None


def test_fuse_one_pe_per_operator_when_slots_suffice(plugins):
    c = ctx(plugins, n_workers=10)
    placement = fuse(annotate(validate(chain_app(1), c), c), c)
    assert len(placement.pes) == 5
    assert all(len(pe.operators) == 1 for pe in placement.pes.values())


def test_fuse_starts_from_the_sink_end(plugins):
    c = ctx(plugins, n_workers=3)
    placement = fuse(annotate(validate(chain_app(3), c), c), c)
    assert list(placement.pes) == ["numbers-1", "tag-2", "tag-3->tag-4->key_by-5->running_sum-6->print-7"]


def test_fuse_single_slot_makes_one_pe_named_after_its_operators(plugins):
    c = ctx(plugins, n_workers=1)
    placement = fuse(annotate(validate(chain_app(1), c), c), c)
    assert list(placement.pes) == ["numbers-1->tag-2->key_by-3->running_sum-4->print-5"]


def test_place_spreads_pes_over_workers(plugins):
    placement = compile_app(chain_app(3), plugins, ["tcp://a", "tcp://b", "tcp://c"], {"tcp://a": "h1"})
    assert [pe.worker for pe in placement.pes.values()] == ["tcp://a", "tcp://b", "tcp://c"]
    assert placement.pes["numbers-1"].host == "h1"
    assert placement.channels() == [("numbers-1", "out", "tag-2", "tag-2"),
                                    ("tag-2", "out", "tag-3", "tag-3->tag-4->key_by-5->running_sum-6->print-7")]


def test_place_without_workers_is_an_error(plugins):
    c = ctx(plugins, n_workers=0)
    with pytest.raises(InvalidApplication, match="no workers"):
        place(fuse(validate(chain_app(1), c), c), c)


def test_each_phase_logs_what_it_did(plugins, caplog):
    with caplog.at_level(logging.INFO, logger="pescheduler.plan.compiler"):
        compile_app(chain_app(2), plugins, ["tcp://a", "tcp://b"], {"tcp://a": "h1", "tcp://b": "h1"})
    lines = [r.getMessage() for r in caplog.records if r.name == "pescheduler.plan.compiler"]
    assert [line.split()[0] for line in lines] == [name for name, _ in PHASES]
    assert "operators" in lines[0] and "PEs for 2 worker(s)" in lines[2] and " on tcp://" in lines[3]
