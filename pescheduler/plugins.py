"""One plugin manager: entry points of the ``pescheduler`` group plus ``--plugin`` modules.

Loading never stops at the first broken plug-in: each failure is recorded with
the plug-in's name and error (see :attr:`Plugins.failures`) and the rest load,
so ``python -m pescheduler plugins`` can show what is wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import pluggy

from . import config, hookspecs
from .errors import ConfigError
from .suggest import did_you_mean

ENTRY_POINT_GROUP = "pescheduler"
hookimpl = pluggy.HookimplMarker("pescheduler")


@dataclass(frozen=True)
class PluginFailure:
    """A plug-in that could not be loaded: its name, where it came from, and why."""

    name: str
    origin: str
    error: str


@dataclass
class Plugins:
    """The loaded plugin manager and what it found, by kind, with origins."""

    manager: pluggy.PluginManager
    origins: dict[str, str] = field(default_factory=dict)      # plug-in name -> dist or module
    failures: list[PluginFailure] = field(default_factory=list)
    operators: dict[tuple[str, str], type] = field(default_factory=dict)   # (kind, name) -> class
    operator_origins: dict[tuple[str, str], str] = field(default_factory=dict)
    aggregates: dict[str, object] = field(default_factory=dict)
    resource_managers: dict[str, type] = field(default_factory=dict)

    def operator(self, name: str, kind: str = "operator") -> type:
        """The class registered as ``name`` among ``kind`` ("source", "operator", "sink").

        An unknown name raises with the names that exist, so the message is the fix.
        """
        try:
            return self.operators[(kind, name)]
        except KeyError:
            names = sorted(n for k, n in self.operators if k == kind and not internal(n))
            known = ", ".join(names) or "(none)"
            hint = ""
            if self.failures:
                hint = " Some plug-ins failed to load: " + "; ".join(
                    f"{f.name} ({f.error.strip().splitlines()[-1]})" for f in self.failures)
            raise UnknownOperatorError(
                f"unknown {kind} {name!r}.{did_you_mean(name, names)} Known {kind}s: {known}. "
                f"Register it with a pescheduler_operators() hook in a module named by the "
                f"'pescheduler' entry-point group or by --plugin.{hint}") from None

    def policies(self) -> dict[str, object]:
        """Plug-ins implementing ``pescheduler_policy_decide``, by plug-in name."""
        return {
            self.manager.get_name(impl.plugin): impl.plugin
            for impl in self.manager.hook.pescheduler_policy_decide.get_hookimpls()
        }


def internal(name: str) -> bool:
    """Operators the ``ep`` planner places itself (``ep_*``): not for apps, hidden from listings."""
    return name.startswith("ep_")


class UnknownOperatorError(LookupError):
    """An app names an operator no plug-in provides."""


def require_loaded(found: Plugins, modules: Iterable[str]) -> None:
    """Raise PluginError naming each of ``modules`` (``--plugin``) that failed to load, and why."""
    wanted = set(modules)
    failed = [f for f in found.failures if f.name in wanted]
    if failed:
        raise PluginError("; ".join(f"--plugin {f.name} failed to load: {f.error.strip().splitlines()[-1]}"
                                    for f in failed))


class PluginError(ImportError):
    """A plug-in named with ``--plugin`` failed to load (import error, bad hook signature, unknown hook)."""


def _entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def load_plugins(modules: Iterable[str] = ()) -> Plugins:
    """Build the plugin manager: entry points first, then the named ``modules``."""
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    found = Plugins(pm)
    for ep in sorted(_entry_points(), key=lambda e: e.name):
        origin = f"{ep.dist.name} {ep.dist.version}" if ep.dist else ep.value
        _register(found, ep.name, origin, ep.load)
    for module in modules:
        _register(found, module, f"--plugin {module}", lambda m=module: importlib.import_module(m))
    _unknown_hooks(found)
    _collect(found)
    return found


def _unknown_hooks(found: Plugins) -> None:
    """A ``pescheduler_*`` function no hookspec names (a misspelt hook) fails its plug-in, by name.

    ``pm.check_pending()`` would raise for the first one and hide the others.
    """
    pm = found.manager
    for name in list(pm.hook.__dict__):
        caller = getattr(pm.hook, name)
        if not name.startswith("pescheduler_") or caller.spec is not None:
            continue
        for impl in caller.get_hookimpls():
            plugin = pm.get_name(impl.plugin)
            known = ", ".join(sorted(n for n in pm.hook.__dict__ if getattr(pm.hook, n).spec is not None))
            found.failures.append(PluginFailure(
                plugin, found.origins.get(plugin, ""),
                f"{name} is not a pescheduler hook (known: {known}); see pescheduler/hookspecs.py"))
            pm.unregister(impl.plugin)
            found.origins.pop(plugin, None)


def _register(found: Plugins, name: str, origin: str, load) -> None:
    if found.manager.has_plugin(name):
        return
    try:
        plugin = load()
        found.manager.register(plugin, name=name)
    except Exception as exc:  # a broken plug-in must not hide the others
        text = "".join(traceback.format_exception_only(type(exc), exc))
        found.failures.append(PluginFailure(name, origin, text))
        return
    found.origins[name] = origin


def _collect(found: Plugins) -> None:
    """Ask every plug-in for what it provides, remembering which plug-in gave what."""
    pm = found.manager
    for impl in pm.hook.pescheduler_operators.get_hookimpls():
        plugin_name = pm.get_name(impl.plugin)
        for cls in impl.function() or ():
            name = getattr(cls, "name", "")
            if not name:
                found.failures.append(PluginFailure(plugin_name, found.origins.get(plugin_name, ""),
                                                    f"{cls!r} has no 'name' attribute"))
                continue
            key = (getattr(cls, "kind", "operator"), name)
            if key in found.operators and found.operators[key] is not cls:
                found.failures.append(PluginFailure(
                    plugin_name, found.origins.get(plugin_name, ""),
                    f"{key[0]} {name!r} is already provided by {found.operator_origins[key]}"))
                continue
            found.operators[key] = cls
            found.operator_origins[key] = plugin_name
    for impl in pm.hook.pescheduler_aggregates.get_hookimpls():
        for agg in impl.function() or ():
            found.aggregates[agg.name] = agg
    for impl in pm.hook.pescheduler_resource_managers.get_hookimpls():
        found.resource_managers.update(impl.function() or {})
    for impl in pm.hook.pescheduler_config.get_hookimpls():
        _declare(found, impl, config.declare)
    for impl in pm.hook.pescheduler_policy_defaults.get_hookimpls():
        _declare(found, impl, config.declare_policy)


def _declare(found: Plugins, impl, declare) -> None:
    """Declare what a plug-in's settings hook returns; a clash or a non-mapping fails that plug-in."""
    plugin_name = found.manager.get_name(impl.plugin)
    try:
        declare(plugin_name, impl.function() or {})
    except ConfigError as exc:
        found.failures.append(PluginFailure(plugin_name, found.origins.get(plugin_name, ""), str(exc)))


@lru_cache(maxsize=None)
def default_plugins(modules: tuple[str, ...] = ()) -> Plugins:
    """The process-wide plugin set (entry points plus ``modules``), loaded once."""
    return load_plugins(modules)


_active_modules: tuple[str, ...] = ()


def activate(modules: tuple[str, ...] | list[str]) -> Plugins:
    """Make entry points plus ``modules`` the set operators look things up in (this process).

    The deployment activates its ``--plugin`` modules in the deploying process
    and on every worker, so e.g. a window finds an aggregate from such a module.
    """
    global _active_modules
    _active_modules = tuple(sorted(set(_active_modules) | set(modules)))
    return active_plugins()


def prepare(modules: tuple[str, ...] | list[str] = ()) -> Plugins:
    """The plug-ins and settings checked before anything starts (the command line and ``deploy()``):
    entry points plus ``modules`` activated, a module of ``modules`` that failed to load an error
    (:class:`PluginError`), then every setting validated, after the plug-ins declared theirs."""
    found = activate(tuple(modules))
    require_loaded(found, modules)
    config.validate()
    return found


def active_plugins() -> Plugins:
    """The plugin set activated in this process (entry points alone until ``activate``)."""
    return default_plugins(_active_modules)
