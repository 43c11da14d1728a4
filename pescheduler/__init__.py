"""pescheduler: Python stream processing on Dask.

An application is a graph of operators (pluggy plug-ins) grouped into
processing elements placed on Dask workers: fused operators call each other
directly, PEs talk over batched, credit-based channels.

Public names::

    Application, Stream           describe an app (pescheduler.app)
    deploy, Deployment            run it (pescheduler.deployment)
    Operator, Source, Sink, Parallelism, Emitter, OperatorContext
                                  write operator plug-ins (pescheduler.operator)
    hookimpl                      mark plug-in hook implementations
    Fuse, Split, Move, Replicate, Release, BorrowHosts, ReturnHost
                                  actions (pescheduler.actions) for Deployment.apply and policies
"""

from .actions import BorrowHosts, Fuse, Move, Release, Replicate, ReturnHost, Split
from .app import Application, Stream
from .deployment import Deployment, deploy
from .errors import AppLoadError, DeploymentFailed, InvalidApplication, PeschedulerError
from .operator import (MAX_WATERMARK, DeadLetter, Emitter, Operator, OperatorContext, Parallelism,
                       Sink, Source)
from .plugins import hookimpl

__version__ = "0.1.0"

__all__ = [
    "Application", "Stream", "deploy", "Deployment", "Operator", "Source", "Sink", "Parallelism",
    "Emitter", "OperatorContext", "DeadLetter", "MAX_WATERMARK", "hookimpl",
    "PeschedulerError", "InvalidApplication", "AppLoadError", "DeploymentFailed",
    "Fuse", "Split", "Move", "Replicate", "Release", "BorrowHosts", "ReturnHost",
]
