"""The reconfiguration plan: which PEs go, which stay, which channels are held and re-wired."""

from __future__ import annotations

import pytest

from pescheduler import Application
from pescheduler.actions import Fuse, Move, Split
from pescheduler.plan.compiler import compile_app
from pescheduler.plugins import load_plugins
from pescheduler.control.protocol import plan_reconfiguration
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import channel_ids

WORKERS = ["tcp://a", "tcp://b", "tcp://c"]


@pytest.fixture(scope="module")
def before():
    app = Application("t")
    app.source("numbers").apply("tag", tag="1").apply("tag", tag="2").apply("tag", tag="3").sink("print")
    placement = compile_app(app, load_plugins(["support_ops"]), WORKERS)
    return placement, channel_ids(placement, "d", 0)


def test_move_of_a_middle_pe_holds_upstream_and_waits_downstream(before):
    old, channels = before
    new = transform(old, Move("tag-2", "tcp://c"))
    plan = plan_reconfiguration(old, new, channels, "d", 1)
    assert plan.retired == ("tag-2",) and plan.created == ("tag-2",)
    assert plan.hold == {"numbers-1": ["d/0/numbers-1.out->tag-2"]}
    assert plan.seen == {"tag-3->tag-4->print-5": ["d/0/tag-2.out->tag-3->tag-4->print-5"]}
    assert plan.channels[("numbers-1", "out", "tag-2")] == "d/1/numbers-1.out->tag-2"     # a new channel
    assert plan.upstream_outputs == {"numbers-1": [("numbers-1", "out", "tag-2")]}
    assert plan.downstream_inputs == {"tag-3->tag-4->print-5": [("tag-2", "out", "tag-3->tag-4->print-5")]}


def test_fuse_at_the_sink_end_has_no_downstream(before):
    old, channels = before
    new = transform(old, Fuse("tag-2", "tag-3->tag-4->print-5"))
    plan = plan_reconfiguration(old, new, channels, "d", 1)
    assert set(plan.retired) == {"tag-2", "tag-3->tag-4->print-5"}
    assert plan.created == ("tag-2->tag-3->tag-4->print-5",)
    assert plan.hold == {"numbers-1": ["d/0/numbers-1.out->tag-2"]} and plan.seen == {}


def test_channels_between_unchanged_pes_keep_their_ids(before):
    old, channels = before
    new = transform(old, Split("tag-3->tag-4->print-5", ("print-5",), worker="tcp://a"))
    plan = plan_reconfiguration(old, new, channels, "d", 1)
    assert plan.channels[("numbers-1", "out", "tag-2")] == "d/0/numbers-1.out->tag-2"
    assert "numbers-1" not in plan.hold and plan.seen == {}
    assert plan.hold == {"tag-2": ["d/0/tag-2.out->tag-3->tag-4->print-5"]}
