"""pescheduler: Python stream processing on Dask.

An application is a graph of operators (pluggy plug-ins) grouped into
processing elements placed on Dask workers: fused operators call each other
directly, PEs talk over batched, credit-based channels.

Public names::

    Application, Stream           describe an app (pescheduler.plan.app)
    deploy, Deployment            run it (pescheduler.control.deployment)
    col, lit                      expressions for map/filter, compiled per backend (pescheduler.expr)
    when, coalesce                conditionals of those expressions (SQL's CASE WHEN, COALESCE)
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

from .actions import BorrowHosts, Fuse, Move, Release, Replicate, ReturnHost, Split
from .plan.app import Application, Stream
from .control.deployment import Deployment, deploy
from .expr import coalesce, col, lit, when
from .errors import AppCheckFailed, AppLoadError, DeploymentFailed, InvalidApplication, PeschedulerError
from .operator import (MAX_WATERMARK, MIN_WATERMARK, DeadLetter, Emitter, Operator, OperatorContext,
                       Parallelism, Sink, Source)
from .plugins import hookimpl
from .metrics import MetricsSnapshot
from .resources import (Host, HostAvailable, HostLost, HostReturnRequested, ResourceManager,
                                ResourceView)
from .plan.placement import Placement

__version__ = "0.1.0"

__all__ = [
    "Application", "Stream", "deploy", "Deployment", "col", "lit", "when", "coalesce", "Operator", "Source", "Sink", "Parallelism",
    "Emitter", "OperatorContext", "DeadLetter", "MAX_WATERMARK", "MIN_WATERMARK", "hookimpl",
    "MetricsSnapshot", "Placement", "ResourceManager", "ResourceView", "Host", "HostAvailable",
    "HostLost", "HostReturnRequested",
    "PeschedulerError", "InvalidApplication", "AppLoadError", "AppCheckFailed", "DeploymentFailed",
    "Fuse", "Split", "Move", "Replicate", "Release", "BorrowHosts", "ReturnHost",
]


def __getattr__(name: str):
    """``pescheduler.sql`` on first use (it imports sqlglot, which an app without SQL never needs)."""
    if name == "sql":
        import importlib

        return importlib.import_module(".sql", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
