"""pescheduler: Python stream processing on Dask.

An application is a graph of operators (pluggy plug-ins) grouped into
processing elements placed on Dask workers: fused operators call each other
directly, PEs talk over batched, credit-based channels.

Public names::

    Application, Stream           describe an app (pescheduler.plan.app)
    deploy, Deployment            run it (pescheduler.control.deployment)
    col, lit                      expressions for map/filter, compiled per backend (pescheduler.expr)
    when, coalesce, nullif        conditionals of those expressions (SQL's CASE WHEN, COALESCE, NULLIF)
    upper, lower, length, substring, trim, ltrim, rtrim, concat, replace, position
                                  their string functions, one meaning on every backend (pescheduler.strings)
    sql                           a streaming SQL query as a Stream: pescheduler.sql(query, sources={...})
    Operator, Source, Sink, Parallelism, Emitter, OperatorContext
                                  write operator plug-ins (pescheduler.operator)
    hookimpl                      mark plug-in hook implementations
    Fuse, Split, Move, Replicate, Release, BorrowHosts, ReturnHost
                                  actions (pescheduler.actions) for Deployment.apply and policies
    MetricsSnapshot, Placement    what a policy sees (pescheduler.metrics, pescheduler.plan.placement)
    ResourceManager, ResourceView, Host, HostAvailable, HostReturnRequested, HostLost
                                  write a resource manager (pescheduler.resources)

Where things live: ``plan/`` (app, compiler, placement, transforms, routing:
data, no cluster), ``control/`` (the deploying process: deployment,
reconfiguration, controller, hosts, monitor, status), ``worker/`` (inside a
Dask worker: PE host, PE loop, chain, channels), ``ep/`` (the event-processing
API), ``resource_managers/``; between the layers, the contract types both sides import:
``wire.py`` (the specs a PE is built from), ``metrics.py`` (what policies see),
``resources.py`` (what a resource manager implements).
"""

from typing import TYPE_CHECKING

# Every public name is imported on first use (PEP 562), not by ``import pescheduler``: the
# command line, an app file's ``from pescheduler import Application`` and a fork server's worker
# need different parts, and ``deploy`` alone pulls in distributed (about 0.4 s). Where each
# name lives:
_HOMES = {
    ".actions": ("BorrowHosts", "Fuse", "Move", "Release", "Replicate", "ReturnHost", "Split"),
    ".plan.app": ("Application", "Stream"),
    ".control.deployment": ("Deployment", "deploy"),
    ".expr": ("coalesce", "col", "concat", "length", "lit", "lower", "ltrim", "nullif", "position", "replace",
              "rtrim", "substring", "trim", "upper", "when"),
    ".errors": ("AppCheckFailed", "AppLoadError", "DeploymentFailed", "InvalidApplication", "PeschedulerError"),
    ".operator": ("MAX_WATERMARK", "MIN_WATERMARK", "DeadLetter", "Emitter", "Operator", "OperatorContext",
                  "Parallelism", "Sink", "Source"),
    ".plugins": ("hookimpl",),
    ".metrics": ("MetricsSnapshot",),
    ".resources": ("Host", "HostAvailable", "HostLost", "HostReturnRequested", "ResourceManager", "ResourceView"),
    ".plan.placement": ("Placement",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__version__ = "0.1.0"

__all__ = [
    "Application", "Stream", "deploy", "Deployment", "col", "lit", "when", "coalesce", "nullif",
    "upper", "lower", "length", "substring", "trim", "ltrim", "rtrim", "concat", "replace", "position",
    "Operator", "Source", "Sink", "Parallelism",
    "Emitter", "OperatorContext", "DeadLetter", "MAX_WATERMARK", "MIN_WATERMARK", "hookimpl",
    "MetricsSnapshot", "Placement", "ResourceManager", "ResourceView", "Host", "HostAvailable",
    "HostLost", "HostReturnRequested",
    "PeschedulerError", "InvalidApplication", "AppLoadError", "AppCheckFailed", "DeploymentFailed",
    "Fuse", "Split", "Move", "Replicate", "Release", "BorrowHosts", "ReturnHost",
]


def __getattr__(name: str):
    """A public name from its home module (:data:`_HOMES`) on first use, then kept here;
    ``pescheduler.sql`` is the SQL module (it imports sqlglot, which an app without SQL never needs)."""
    import importlib

    if name == "sql":
        return importlib.import_module(".sql", __name__)
    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "sql"})


if TYPE_CHECKING:                  # what type checkers and IDEs see; nothing is imported at run time
    from .actions import BorrowHosts, Fuse, Move, Release, Replicate, ReturnHost, Split
    from .control.deployment import Deployment, deploy
    from .errors import AppCheckFailed, AppLoadError, DeploymentFailed, InvalidApplication, PeschedulerError
    from .expr import (coalesce, col, concat, length, lit, lower, ltrim, nullif, position, replace, rtrim,
                       substring, trim, upper, when)
    from .metrics import MetricsSnapshot
    from .operator import (MAX_WATERMARK, MIN_WATERMARK, DeadLetter, Emitter, Operator, OperatorContext,
                           Parallelism, Sink, Source)
    from .plan.app import Application, Stream
    from .plan.placement import Placement
    from .plugins import hookimpl
    from .resources import (Host, HostAvailable, HostLost, HostReturnRequested, ResourceManager,
                            ResourceView)
