"""Settings: packaged defaults, PESCHEDULER__ environment variables, --config files."""

from __future__ import annotations

import os
import subprocess
import sys

from pescheduler import config


def test_defaults_come_from_the_packaged_yaml():
    assert config.get("batch.size") == 1000
    assert config.get_seconds("monitor.interval") == 1.0


def test_short_environment_variables_are_honoured():
    env = {**os.environ, "PESCHEDULER__BATCH__SIZE": "500", "PESCHEDULER__MONITOR__INTERVAL": "250ms"}
    out = subprocess.run([sys.executable, "-c", "from pescheduler import config; "
                          "print(config.get('batch.size'), config.get_seconds('monitor.interval'))"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["500", "0.25"]


def test_config_file_with_or_without_the_top_level(tmp_path):
    import copy

    import dask

    saved = copy.deepcopy(dask.config.config)
    try:
        (tmp_path / "a.yaml").write_text("pescheduler:\n  channel:\n    credits: 3\n")
        config.load_file(str(tmp_path / "a.yaml"))
        assert config.get("channel.credits") == 3
        (tmp_path / "b.yaml").write_text("channel:\n  credits: 5\n")
        config.load_file(str(tmp_path / "b.yaml"))
        assert config.get("channel.credits") == 5
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
    assert config.get("channel.credits") == 8


# -- validation: unknown keys, bad values ------------------------------------------------------

import re
from pathlib import Path

import dask
import pytest
import yaml

from pescheduler.errors import ConfigError


def _restore():
    import copy
    return copy.deepcopy(dask.config.config)


def _invalid(values: dict) -> str:
    saved = _restore()
    try:
        dask.config.update(dask.config.config, {"pescheduler": values}, priority="new")
        with pytest.raises(ConfigError) as info:
            config.validate()
        return str(info.value)
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_the_packaged_defaults_are_valid():
    config.validate()


def test_an_unknown_key_names_the_closest_valid_one():
    message = _invalid({"channel": {"credit": 3}, "monitor": {"intervall": "1s"}})
    assert "channel.credit: unknown key; did you mean channel.credits?" in message
    assert "monitor.intervall: unknown key; did you mean monitor.interval?" in message


def test_a_bad_value_names_key_value_and_expected_form():
    message = _invalid({"batch": {"size": "big"}, "monitor": {"interval": "soon"},
                        "policies": {"rate": {"tolerance": "wide"}}})
    assert "batch.size: 'big' is not valid; expected an integer >= 1" in message
    assert "monitor.interval: 'soon' is not valid; expected a duration longer than 0 such as 1s" in message
    assert "policies.rate.tolerance: 'wide' is not valid; expected a number" in message


def test_credits_must_be_at_least_one():
    assert "channel.credits: 0 is not valid; expected an integer >= 1" in _invalid({"channel": {"credits": 0}})


def test_underscores_spell_the_same_keys_and_nullable_keys_take_null():
    saved = _restore()
    try:
        dask.config.update(dask.config.config, {"pescheduler": {"dead_letters": {"keep": 5, "path": None},
                                                                "cluster": {"workers": 3},
                                                                "rm": {"spark": {"conf": {"spark.x": 1}}}}})
        config.validate()
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_section_gives_every_declared_default_under_what_was_given():
    rate = config.section("policies.rate", {"max_copies": 3})
    assert rate["max-copies"] == 3 and rate["tolerance"] == 0.15
    assert config.section("policies.not-declared", {"a": 1}) == {"a": 1}


def test_a_plugin_declares_its_section_once_and_may_not_redeclare_packaged_keys():
    config.declare("test-plugin", {"policies": {"test-only": {"limit": 3}}})
    config.declare("test-plugin", {"policies": {"test-only": {"limit": 3}}})      # loaded again: fine
    assert config.section("policies.test-only")["limit"] == 3
    assert "policies.test-only.limit" in config.declared_keys()
    with pytest.raises(ConfigError, match="plug-in evil: its pescheduler_config redeclares batch.size"):
        config.declare("evil", {"batch": {"size": 1}})


# -- one home per knob: every key declared is read, every key read is declared ----------------

ROOT = Path(config.__file__).parent.parent
SOURCES = [p for d in ("pescheduler", "policies", "operators") for p in (ROOT / d).rglob("*.py")]
DIRECT = re.compile(r'(?<![.\w])config\.(?:get|get_seconds|section)\(\s*"([^"{}]+)"')
PACKAGED = config._leaves(yaml.safe_load((ROOT / "pescheduler" / "pescheduler.yaml").read_text())["pescheduler"],
                          sections=True)
POLICY_SECTION = re.compile(r'settings\(\s*"([^"]+)",')
INDEXED = re.compile(r'\[\s*"([a-z][a-z0-9-]*)"\s*\]')


def _reads() -> tuple[set[str], dict[str, set[str]]]:
    """Keys read by name, and for each section read whole, the keys its reader indexes."""
    direct: set[str] = set()
    sections: dict[str, set[str]] = {}
    for path in SOURCES:
        text = path.read_text()
        if re.search(r"^from \S+ import .*\bconfig\b", text, re.M):     # elsewhere `config` is a policy's settings dict, not this module
            direct.update(DIRECT.findall(text))
        for key in [k for k in DIRECT.findall(text) if k.startswith("rm.")]:
            sections.setdefault(key, set()).update(INDEXED.findall(text))
        for name in POLICY_SECTION.findall(text):
            direct.add(f"policies.{name}")
            sections.setdefault(f"policies.{name}", set()).update(re.findall(r'cfg\["([^"]+)"\]', text))
    return direct, sections


def test_every_declared_key_is_read_somewhere():
    direct, sections = _reads()
    unread = []
    for key in PACKAGED:
        if key in direct or any(key.startswith(s + ".") and key[len(s) + 1:] in read
                                for s, read in sections.items()):
            continue
        if any(k.startswith(key + ".") for k in PACKAGED):
            continue                                    # a section: its leaves are checked
        unread.append(key)
    assert unread == [], f"declared in pescheduler.yaml but never read: {unread}"


def test_every_key_read_is_declared():
    direct, sections = _reads()
    declared = set(PACKAGED)
    assert sorted(direct - declared) == []
    for section, read in sections.items():
        if section.startswith("policies."):
            assert sorted(f"{section}.{k}" for k in read if f"{section}.{k}" not in declared) == []


def test_no_policy_or_resource_manager_repeats_a_default():
    pattern = re.compile(r'(?:setting|\.get)\(\s*(?:config|s|self\.settings),\s*"[^"]+",')
    offenders = [p.name for p in SOURCES if pattern.search(p.read_text())]
    assert offenders == []


def test_a_section_replaced_by_dask_config_set_keeps_its_declared_defaults():
    # dask.config.set({"pescheduler.rm.spark": {...}}) replaces the mapping rather than merging
    # into it; the Spark manager then died on KeyError('max-executors') inside a background task
    # and never became ready (session 3's regression).
    with dask.config.set({"pescheduler.rm.spark": {"master": "spark://h:7077", "max_executors": 4}}):
        s = config.section("rm.spark")
        assert (s["master"], s["max-executors"], s["lease-timeout"]) == ("spark://h:7077", 4, "90s")
        assert config.get("rm.spark.lease-timeout") == "90s"
        with pytest.raises(KeyError):
            config.get("rm.spark.no-such-key")


# -- durations: 0 where a bound or interval needs time, negative, NaN and infinite refused -------------

def test_zero_negative_nan_and_infinite_durations_are_refused_naming_the_key():
    message = _invalid({"calls": {"worker": "0s", "probe": 0, "scheduler": float("nan")},
                        "checkpoint": {"timeout": "-1s"}, "monitor": {"interval": float("inf")}})
    for key, value in (("calls.worker", "'0s'"), ("calls.probe", "0"), ("calls.scheduler", "nan"),
                       ("checkpoint.timeout", "'-1s'"), ("monitor.interval", "inf")):
        assert f"{key}: {value} is not valid; expected a duration" in message, message


def test_zero_stays_valid_where_it_means_none():
    saved = _restore()
    try:
        dask.config.update(dask.config.config, {"pescheduler": {"batch": {"latency": "0ms"},
                                                                "restart": {"backoff": 0}}})
        config.validate()
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_every_duration_that_must_be_positive_is_a_declared_duration():
    durations = {k for k in config.declared_keys() if isinstance(config.get(k), str) and config._is_duration(
        config.get(k))}
    assert config.POSITIVE_DURATIONS <= durations, config.POSITIVE_DURATIONS - durations


def test_positive_seconds_takes_units_and_refuses_nan_zero_and_negative():
    assert config.positive_seconds("90s") == 90.0 and config.positive_seconds("2") == 2.0
    for bad in ("nan", "inf", "0", "0s", "-1", float("nan")):
        with pytest.raises(ConfigError, match="expected a duration longer than 0"):
            config.positive_seconds(bad, "--duration")


APP = 'from pescheduler import Application\napp = Application("d")\napp.source("iterable", items=[]).sink("discard")\n'


@pytest.mark.parametrize("args,named", [(["--duration", "nan"], "argument --duration: 'nan'"),
                                        (["--duration", "0"], "argument --duration: '0'"),
                                        (["--config", "zero.yaml"], "calls.worker: '0s' is not valid")])
def test_the_cli_exits_2_naming_the_flag_or_key_before_any_worker_starts(tmp_path, args, named):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "zero.yaml").write_text("calls:\n  worker: 0s\n")
    result = subprocess.run([sys.executable, "-m", "pescheduler", "deploy", "app.py", *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "dashboard" not in result.stdout + result.stderr
