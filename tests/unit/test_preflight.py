"""``pescheduler.deploy()`` checks what the command line checks before any process starts (issue 17).

The one pre-flight check (``plugins.prepare`` then ``apploader.check_app``) is
shared by both ways in; these tests drive the Python API and watch that no
worker process was started and that the embedded cluster was never created.
"""

from __future__ import annotations

import inspect

import psutil
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.control import cluster
from pescheduler.errors import AppCheckFailed, InvalidApplication
from pescheduler.plugins import PluginError


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fails the test if an embedded cluster is started or a child process appears."""
    started = []

    async def start(self):
        started.append(self)
        raise AssertionError("the embedded cluster was started")
    monkeypatch.setattr(cluster.EmbeddedCluster, "start", start)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    assert started == []
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def here() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_an_unknown_operator_names_the_app_line_and_the_known_names(nothing_starts):
    app = Application("typo")
    stream = app.source("iterable", items=[1, 2, 3])
    line = here() + 1
    stream.apply("mapp").sink("print")
    with pytest.raises(AppCheckFailed) as err:
        pescheduler.deploy(app, workers=2, policies=[])
    message = str(err.value)
    assert message.startswith(f"{__file__}:{line}: mapp-2: unknown operator 'mapp'. Did you mean 'map'? Known operators:")
    assert " map," in message and 'stream.apply("mapp").sink("print")' in message
    assert "plugins=[MODULE]" in message
    assert (err.value.file, err.value.line) == (__file__, line)
    assert isinstance(err.value, InvalidApplication)        # what deploy() raised before the check moved


def test_an_operator_in_a_chain_is_named_at_its_own_line(nothing_starts):
    app = Application("chain")
    (app.source("iterable", items=[1])
        .map(lambda e: e)
        .apply("windw", size="1s")
        .sink("print"))
    line = here() - 2
    with pytest.raises(AppCheckFailed) as err:
        pescheduler.deploy(app, workers=2, policies=[])
    assert err.value.line == line and "windw-3: unknown operator 'windw'" in str(err.value)


def test_an_app_without_a_sink_is_refused_before_any_start(nothing_starts):
    app = Application("no-sink")
    app.source("iterable", items=[1])
    with pytest.raises(InvalidApplication, match="has no sink"):
        pescheduler.deploy(app, workers=2, policies=[])


def test_a_plugin_module_that_fails_to_load_is_refused_before_any_start(nothing_starts):
    app = Application("plugged")
    app.source("iterable", items=[1]).sink("print")
    with pytest.raises(PluginError, match="--plugin no_such_plugin_module failed to load"):
        pescheduler.deploy(app, workers=2, plugins=["no_such_plugin_module"], policies=[])


def test_a_misspelt_setting_and_a_bad_value_are_refused_before_any_start(nothing_starts):
    """Settings are checked in deploy() too (issue 17: config validated at start, nothing starts)."""
    import dask

    from pescheduler.errors import ConfigError

    app = Application("tuned")
    app.source("iterable", items=[1]).sink("print")
    with dask.config.set({"pescheduler.channel.credit": 3, "pescheduler.batch.size": -5}):
        with pytest.raises(ConfigError) as err:
            pescheduler.deploy(app, workers=2, policies=[])
    assert "channel.credit: unknown key; did you mean channel.credits?" in str(err.value)
    assert "batch.size: -5 is not valid; expected an integer >= 1" in str(err.value)


def test_a_misspelt_operator_or_policy_gets_a_did_you_mean(nothing_starts):
    from pescheduler.control.controller import UnknownPolicyError

    app = Application("typos")
    app.source("iterable", items=[1]).apply("fliter", fn=bool).sink("print")
    with pytest.raises(AppCheckFailed) as err:
        pescheduler.deploy(app, workers=2, policies=[])
    assert "unknown operator 'fliter'. Did you mean 'filter'? Known operators:" in str(err.value)
    assert "ep_" not in str(err.value)          # the ep planner's own operators are not offered
    good = Application("policy-typo")
    good.source("iterable", items=[1]).sink("print")
    with pytest.raises(UnknownPolicyError, match=r"unknown policy 'rat'\. Did you mean 'rate'\?"):
        pescheduler.deploy(good, workers=2, policies=["rat"])
