"""The latency target (docs/latency.md): one knob, ``pescheduler.batch.latency``, overridden per
deployment (``deploy(latency=)``, ``--latency``), carried in the placement to every PE's channels."""

from __future__ import annotations

import dask
import pytest

from pescheduler import Application, config
from pescheduler.actions import Move, Replicate
from pescheduler.cli import parser
from pescheduler.errors import ConfigError
from pescheduler.plan.compiler import compile_app
from pescheduler.plan.transforms import transform
from pescheduler.plan.wiring import build_specs, channel_ids
from pescheduler.plugins import load_plugins

WORKERS = ["tcp://a", "tcp://b", "tcp://c"]
INFO = {w: {"host": "h", "data_address": f"{w}:1"} for w in WORKERS}


def app():
    a = Application("t")
    a.source("numbers").apply("tag", tag="1").apply("tag", tag="2").sink("print")
    return a


def specs(placement):
    return build_specs(placement, INFO, "d", channel_ids(placement, "d", 0))


def test_the_target_given_at_compile_reaches_every_pe_also_after_a_reconfiguration():
    placement = compile_app(app(), load_plugins(["support_ops"]), WORKERS, latency_s=0.004)
    assert placement.latency_s == 0.004
    assert {spec.latency_s for spec in specs(placement).values()} == {0.004}
    changed = transform(transform(placement, Move("tag-2", "tcp://c")), Replicate("tag-3", 1))
    assert {spec.latency_s for spec in specs(changed).values()} == {0.004}


def test_without_one_the_configured_target_is_used():
    with dask.config.set({"pescheduler.batch.latency": "3ms"}):
        placement = compile_app(app(), load_plugins(["support_ops"]), WORKERS)
    assert placement.latency_s == pytest.approx(0.003)


def test_the_command_line_takes_a_duration_and_refuses_what_is_not_one(capsys):
    args = parser().parse_args(["deploy", "app.py", "--latency", "2ms"])
    assert args.latency == pytest.approx(0.002)
    assert parser().parse_args(["deploy", "app.py", "--latency", "0"]).latency == 0
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(["deploy", "app.py", "--latency", "-1ms"])
    assert exit_.value.code == 2 and "--latency" in capsys.readouterr().err


def test_a_bad_target_names_itself():
    with pytest.raises(ConfigError, match="latency: 'soon' is not valid"):
        config.seconds("soon", "latency")


def test_deploy_refuses_a_bad_target_before_anything_starts():
    import pescheduler

    plain = Application("t")
    plain.source("numbers").sink("print")
    with pytest.raises(ConfigError, match="latency: '-1ms' is not valid"):
        pescheduler.deploy(plain, latency="-1ms", plugins=["support_ops"])
