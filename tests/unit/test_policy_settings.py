"""A third-party policy declares its settings without naming itself (issue 17).

The plug-in below is a ``--plugin`` module written to a temporary folder, the
way a user tries a policy before packaging it; ``pescheduler_policy_defaults``
places its defaults under ``policies.<the name it is registered by>``, where the
validator and the controller find them. (The packaged, entry-point case:
tests/integration/test_policies_example.py.)
"""

from __future__ import annotations

import copy
import textwrap

import dask.config
import pytest

from pescheduler import cli, config
from pescheduler.control.controller import policy_configs
from pescheduler.errors import ConfigError
from pescheduler.plugins import load_plugins

POLICY = '''
import pescheduler


@pescheduler.hookimpl
def pescheduler_policy_defaults():
    return {"busy": 0.9, "calm": "5s"}


@pescheduler.hookimpl
def pescheduler_policy_decide(snapshot, placement, resources, config):
    return []
'''


@pytest.fixture
def settings():
    """dask.config as it was, after the test."""
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


def plugin(tmp_path, monkeypatch, module: str, text: str = POLICY) -> str:
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for folder in list(path.parents)[:module.count(".")]:
        (folder / "__init__.py").touch()
    path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def test_a_plugin_policy_takes_its_settings_under_its_own_name(tmp_path, monkeypatch, settings):
    name = plugin(tmp_path, monkeypatch, "busy_guard_a")
    found = load_plugins((name,))
    assert found.failures == [] and name in found.policies()
    dask.config.set({f"pescheduler.policies.{name}.busy": 0.5})
    config.validate()
    settings_seen = policy_configs([name])[name]
    assert (settings_seen["busy"], settings_seen["calm"], settings_seen["history"]) == (0.5, "5s", {})


def test_a_misspelt_key_of_a_plugin_policy_names_the_closest(tmp_path, monkeypatch, settings):
    name = plugin(tmp_path, monkeypatch, "busy_guard_b")
    load_plugins((name,))
    dask.config.set({f"pescheduler.policies.{name}.bussy": 0.5, f"pescheduler.policies.{name}.calm": -1})
    with pytest.raises(ConfigError) as err:
        config.validate()
    key = f"policies.{name.replace('_', '-')}"        # keys are shown dashed, as dask.config reads both
    assert f"{key}.bussy: unknown key; did you mean {key}.busy?" in str(err.value)
    assert f"{key}.calm: -1 is not valid; expected a duration such as 5s" in str(err.value)


def test_a_dotted_plugin_module_nests_as_its_settings_are_read(tmp_path, monkeypatch, settings):
    name = plugin(tmp_path, monkeypatch, "guards_c.busy")
    load_plugins((name,))
    dask.config.update(dask.config.config, {"pescheduler": {"policies": {"guards_c": {"busy": {"busy": 0.7}}}}})
    config.validate()
    assert policy_configs([name])[name]["busy"] == 0.7


def test_settings_for_a_policy_that_declares_none_say_how_to_declare_them(tmp_path, monkeypatch, settings):
    name = plugin(tmp_path, monkeypatch, "quiet_guard_d", POLICY.replace("pescheduler_policy_defaults",
                                                                         "_no_settings"))
    load_plugins((name,))
    dask.config.set({f"pescheduler.policies.{name}.zzz": 1})
    with pytest.raises(ConfigError, match="a policy declares (the|its) settings .*with a "
                                          "pescheduler_policy_defaults hook"):
        config.validate()


def test_defaults_that_are_not_a_mapping_fail_that_plugin_by_name(tmp_path, monkeypatch):
    name = plugin(tmp_path, monkeypatch, "bad_guard_e", POLICY.replace('{"busy": 0.9, "calm": "5s"}', '[1]'))
    [failure] = load_plugins((name,)).failures
    assert failure.name == name and "pescheduler_policy_defaults returned list, not a mapping" in failure.error


def test_the_command_line_refuses_a_misspelt_plugin_policy_key_before_deploying(tmp_path, monkeypatch, capsys,
                                                                                settings):
    name = plugin(tmp_path, monkeypatch, "busy_guard_f")
    (tmp_path / "app.py").write_text('from pescheduler import Application\napp = Application("x")\n'
                                     'app.source("iterable", items=[1]).sink("print")\n')
    (tmp_path / "conf.yaml").write_text(f"policies:\n  {name}:\n    busy: 0.5\n    clam: 3s\n")
    called = []
    monkeypatch.setattr("pescheduler.control.deployment.deploy", lambda *a, **k: called.append(1))
    assert cli.main(["deploy", str(tmp_path / "app.py"), "--plugin", name, "--policy", name,
                     "--config", str(tmp_path / "conf.yaml")]) == 2
    key = f"policies.{name.replace('_', '-')}"
    assert f"{key}.clam: unknown key; did you mean {key}.calm?" in capsys.readouterr().err
    assert called == []
