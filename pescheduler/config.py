"""Settings through dask.config under ``pescheduler`` (defaults in pescheduler.yaml).

One home for every knob, where Dask users already look: every default is in
``pescheduler.yaml`` (a plug-in's in its ``pescheduler_config`` hook), and code
reads values with :func:`get`, :func:`get_seconds` or :func:`section`,
never with a literal fallback. :func:`validate` checks what the user set
against those declared defaults before anything starts.

Example::

    from pescheduler import config
    config.get("batch.size")                 # 1000
    config.section("policies.rate")["tolerance"]
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any, Mapping

import dask.config
import yaml
from dask.utils import parse_timedelta

from .errors import ConfigError
from .suggest import closest

_DEFAULTS = os.path.join(os.path.dirname(__file__), "pescheduler.yaml")

# libyaml's parser where PyYAML has it: the same documents, and this one read by every process
# at its start (10 against 1 ms; the command line's first output and `stop` wait for it, issue 34).
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

with open(_DEFAULTS) as _f:
    _declared: dict = yaml.load(_f, Loader=_SafeLoader)["pescheduler"]
dask.config.update_defaults({"pescheduler": copy.deepcopy(_declared)})

# dask reads DASK_PESCHEDULER__X; the short PESCHEDULER__X form is ours and documented.
_ENV_PREFIX = "PESCHEDULER__"


def apply_env() -> None:
    """Apply ``PESCHEDULER__X`` variables over dask's config (at import; again in a forked worker,
    after ``dask.config.refresh()`` with the deploying process's environment)."""
    env = {"DASK_PESCHEDULER__" + k[len(_ENV_PREFIX):]: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)}
    if env:
        dask.config.update(dask.config.config, dask.config.collect_env(env), priority="new")


apply_env()

# The expected form of keys whose default is null or that may be set to null; every other
# key's form is its default's type (an integer, a number, a duration, a string, a list).
NULLABLE_FORMS = {
    "cluster.workers": "an integer >= 1 or null",
    "checkpoint.storage": "an fsspec URL or directory, or null",
    "checkpoint.key": "a secret string, or null for the key file",
    "dead-letters.path": "a file path or null",
    "rm.name": "a resource manager name (local, lab, spark, none) or null",
    "rm.local.demand": "a schedule file, a list of {at, want|free} entries, a callable, or null",
    "rm.local.reclaim-after": "a duration such as 10s, or null",
    "rm.spark.master": "spark://host:port or null",
    "policies.decision-log": "a file path or null",
    "policies.threshold.memory-box": "a number of bytes or null",
    "state.dir": "a directory or null",
}
# Integers that must be at least 1 (0 would hang or divide by zero); others must be >= 0.
AT_LEAST_ONE = {"batch.size", "channel.credits", "pe.time-slice-ms", "monitor.history", "cluster.workers",
                "rm.local.workers-per-host", "rm.spark.workers", "rm.spark.max-executors",
                "policies.rate.down-after", "policies.move.after", "rm.lab.hosts", "checkpoint.retain",
                "sinks.retry.attempts"}
CHOICES = {"pe.allocator": ("jemalloc", "system")}     # string settings with a fixed set of values
OPEN_MAPPINGS = {"rm.spark.conf"}        # any keys: passed through to Spark as they are
# Durations that must be longer than 0 (a bound of 0 fails every call, an interval of 0 spins);
# every other duration may be 0 (no linger, no backoff, no cooldown). None may be negative or NaN.
POSITIVE_DURATIONS = {"monitor.interval", "stall.timeout", "cluster.start-timeout", "cluster.connect-timeout",
                      "checkpoint.timeout", "calls.worker", "calls.probe", "calls.scheduler", "rm.start-timeout",
                      "rm.local.start-timeout", "rm.lab.start-timeout", "rm.spark.lease-timeout",
                      "rm.spark.poll-interval", "rm.spark.executor-idle-timeout", "policies.apply-timeout",
                      "policies.deadline"}


def get(key: str) -> Any:
    """``pescheduler.<key>`` from dask.config, e.g. ``get("batch.size")``; a missing key raises KeyError.

    A key missing because a caller replaced its whole section (``dask.config.set(
    {"pescheduler.rm.spark": {"master": ...}})`` sets that mapping, it does not
    merge into it) falls back to its declared default.
    """
    try:
        return dask.config.get(f"pescheduler.{key}")
    except KeyError:
        return _declared_default(key)


def _declared_default(key: str) -> Any:
    """The default declared for ``pescheduler.<key>`` (pescheduler.yaml or a plug-in's hook); KeyError if none."""
    for defaults in reversed(dask.config.defaults):
        value = dask.config.get(f"pescheduler.{key}", default=_MISSING, config=defaults)
        if value is not _MISSING:
            return value
    raise KeyError(f"pescheduler.{key}")


_MISSING = object()


def get_seconds(key: str) -> float:
    """A duration setting (``"1s"``, ``"500ms"``, a number of seconds) in seconds."""
    return float(parse_timedelta(get(key), default="seconds"))


def seconds(value: str | int | float, name: str = "") -> float:
    """A duration that may be 0 (``"1ms"``, ``0``, a number of seconds) in seconds; ConfigError
    naming ``name`` when it is negative, NaN, infinite or no duration."""
    if not _is_duration(value):
        raise ConfigError(f"{name + ': ' if name else ''}{value!r} is not valid; expected a duration of 0 or more "
                          f"(e.g. 1ms, 0 or a number of seconds)")
    return float(parse_timedelta(value, default="seconds"))


def positive_seconds(value: str | int | float, name: str = "") -> float:
    """A duration that must be longer than 0 (``"90s"``, ``"500ms"``, or a number of seconds) in
    seconds; ConfigError naming ``name`` (a key; argparse names a flag itself) when it is 0,
    negative, NaN or infinite."""
    if not _is_duration(value) or parse_timedelta(value, default="seconds") <= 0:
        raise ConfigError(f"{name + ': ' if name else ''}{value!r} is not valid; expected a duration longer than 0 "
                          f"(e.g. 30s, 500ms or a number of seconds)")
    return float(parse_timedelta(value, default="seconds"))


def section(name: str, given: Mapping[str, Any] | None = None) -> dict:
    """The settings under ``pescheduler.<name>``, overlaid with ``given`` (keys spelt with ``-`` or ``_``).

    Plug-ins that receive a settings dict (policies, resource managers) read
    it through this, so a caller passing only some keys (a test, a notebook)
    still gets every declared default, and no plug-in repeats a default.
    """
    # A plug-in that declares no settings has no section (or one named like another key,
    # a policy called ``cooldown``): it gets what it was given.
    merged: dict = {}
    for layer in (*dask.config.defaults, dask.config.config):   # a replaced section keeps its defaults
        declared = dask.config.get(f"pescheduler.{name}", default=None, config=layer)
        if isinstance(declared, Mapping):
            merged.update({_dashed(k): v for k, v in declared.items()})
    merged.update({_dashed(k): v for k, v in (given or {}).items()})
    return merged


def load_file(path: str) -> dict:
    """Read a YAML config file (the ``--config`` option) and apply it; returns what it set.

    A file without the ``pescheduler:`` top level is taken as its content.
    """
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must hold a mapping, got {type(data).__name__}")
    if "pescheduler" not in data:
        data = {"pescheduler": data}
    dask.config.update(dask.config.config, data, priority="new")
    return data


_from_plugins: dict[tuple[str, str], dict] = {}      # (plug-in name, hook) -> the defaults it declared


def declare(plugin: str, defaults: Mapping[str, Any], hook: str = "pescheduler_config") -> None:
    """Add a plug-in's default settings (from its ``hook``) beside the packaged ones.

    A plug-in declares new keys only: a key declared elsewhere raises
    ConfigError naming the plug-in. Declaring the same again is a no-op (the
    plug-in set may be loaded more than once in a process).
    """
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"plug-in {plugin}: its {hook} returned {type(defaults).__name__}, not a mapping")
    defaults = copy.deepcopy(dict(defaults))
    if _from_plugins.get((plugin, hook)) == defaults:
        return
    clash = sorted(set(_leaves(defaults)) & set(_leaves(_declared)))
    if clash:
        raise ConfigError(f"plug-in {plugin}: its {hook} redeclares {', '.join(clash)}")
    _from_plugins[(plugin, hook)] = defaults
    dask.config.update(_declared, copy.deepcopy(defaults))
    dask.config.update_defaults({"pescheduler": copy.deepcopy(defaults)})


def declare_policy(policy: str, defaults: Mapping[str, Any]) -> None:
    """Declare a policy's settings (its ``pescheduler_policy_defaults``) as ``policies.<policy>``;
    a dotted name (a ``--plugin pkg.module`` policy) nests, as reading ``policies.pkg.module`` does."""
    tree: Any = defaults
    if isinstance(defaults, Mapping):           # else declare() says what is wrong with it
        for part in reversed(["policies", *policy.split(".")]):
            tree = {part: tree}
    declare(policy, tree, "pescheduler_policy_defaults")


def declared_keys() -> list[str]:
    """Every declared key, dotted (``channel.credits``), sections included."""
    return sorted(_leaves(_declared, sections=True))


def validate() -> None:
    """Check every ``pescheduler`` setting against the declared defaults; ConfigError lists all problems.

    An unknown key names the closest declared one; a bad value names the key,
    the value and the form expected. Called before anything starts.
    """
    problems = _check(dask.config.config.get("pescheduler") or {}, _declared, "")
    if problems:
        raise ConfigError("invalid pescheduler configuration:\n  " + "\n  ".join(problems))


def _check(given: Mapping, declared: Mapping, prefix: str) -> list[str]:
    problems = []
    names = {_dashed(k): k for k in declared}
    for raw, value in given.items():
        key = prefix + _dashed(str(raw))
        if _dashed(str(raw)) not in names:
            problems.append(_unknown(key))
            continue
        default = declared[names[_dashed(str(raw))]]
        if isinstance(default, dict) and default and key not in OPEN_MAPPINGS:
            if isinstance(value, Mapping):
                problems += _check(value, default, key + ".")
            else:
                problems.append(f"{key}: {value!r} is not a mapping; expected keys "
                                f"{', '.join(sorted(default))}")
        else:
            problem = _bad_value(key, value, default)
            if problem:
                problems.append(f"{key}: {value!r} is not valid; expected {problem}")
    return problems


def _unknown(key: str) -> str:
    close = closest(key, declared_keys())
    hint = f"; did you mean {close}?" if close else "; `pescheduler/pescheduler.yaml` lists the keys"
    if key.startswith("policies.") and not close:
        hint = ("; a policy declares the settings it takes with a pescheduler_policy_defaults hook "
                "(docs/policies.md)")
    elif key.startswith("policies."):
        hint += " (a policy declares its settings with a pescheduler_policy_defaults hook)"
    return f"{key}: unknown key{hint}"


def _bad_value(key: str, value: Any, default: Any) -> str | None:
    """The expected form when ``value`` does not fit ``key``, else None."""
    if value is None:
        return None if key in NULLABLE_FORMS else _form(key, default)
    if key in NULLABLE_FORMS and default is None:
        return _fits_nullable(key, value)
    return None if _fits(key, value, default) else _form(key, default)


def _fits_nullable(key: str, value: Any) -> str | None:
    if key == "cluster.workers":
        return None if _is_int(value) and value >= 1 else NULLABLE_FORMS[key]
    if key == "rm.local.reclaim-after":
        return None if _is_duration(value) else NULLABLE_FORMS[key]
    if key == "policies.threshold.memory-box":
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 \
            else NULLABLE_FORMS[key]
    if key in ("rm.name", "rm.spark.master", "dead-letters.path", "checkpoint.key", "state.dir"):
        return None if isinstance(value, str) else NULLABLE_FORMS[key]
    return None


def _fits(key: str, value: Any, default: Any) -> bool:
    if key in CHOICES:
        return value in CHOICES[key]
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return _is_int(value) and value >= (1 if key in AT_LEAST_ONE else 0)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    if isinstance(default, str) and _is_duration(default):
        return _is_duration(value) and (key not in POSITIVE_DURATIONS or parse_timedelta(value, default="seconds") > 0)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, list):
        return isinstance(value, (list, tuple))
    if isinstance(default, dict):
        return isinstance(value, Mapping)
    return True


def _form(key: str, default: Any) -> str:
    if key in NULLABLE_FORMS:
        return NULLABLE_FORMS[key]
    if key in CHOICES:
        return f"one of {', '.join(CHOICES[key])} (default {default})"
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return f"an integer >= {1 if key in AT_LEAST_ONE else 0} (default {default})"
    if isinstance(default, float):
        return f"a number >= 0 (default {default})"
    if isinstance(default, str) and _is_duration(default):
        longer = " longer than 0" if key in POSITIVE_DURATIONS else ""
        return f"a duration{longer} such as {default}"
    if isinstance(default, list):
        return f"a list such as {default}"
    if isinstance(default, dict):
        return "a mapping"
    return f"a string such as {default!r}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_duration(value: Any) -> bool:
    """A finite duration >= 0 (``nan``, ``inf`` and ``-1s`` are not)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    if isinstance(value, str) and not value[:1].isdigit():
        return False
    try:
        return math.isfinite(parse_timedelta(value, default="seconds")) and \
            parse_timedelta(value, default="seconds") >= 0
    except (ValueError, KeyError, TypeError, OverflowError):
        return False


def _dashed(key: str) -> str:
    return key.replace("_", "-")


def _leaves(tree: Mapping, prefix: str = "", sections: bool = False) -> list[str]:
    out = []
    for k, v in tree.items():
        key = prefix + _dashed(str(k))
        if isinstance(v, dict) and v and key not in OPEN_MAPPINGS:
            if sections:
                out.append(key)
            out += _leaves(v, key + ".", sections)
        else:
            out.append(key)
    return out
