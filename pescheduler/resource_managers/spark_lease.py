"""What runs inside a Spark executor while a host is lent: a Dask worker, until it closes.

This module is imported on executors (the lease task refers to :func:`lease`
by module and name), so it imports nothing heavy at module level and nothing
from the driver side. :func:`lease` never raises: a failed task would be
retried by Spark, which would start a second worker for the same host.
"""

from __future__ import annotations

DEATH_TIMEOUT_S = 60.0       # a worker that cannot reach its scheduler this long closes: the lease ends


def lease(args: tuple) -> str:
    """Run a Dask worker named ``host_id`` against ``scheduler`` until it is retired.

    Returns a one-line outcome (``closed ...`` or ``failed ...``), never raises.
    """
    scheduler, host_id = args[0], args[1]
    security = args[2] if len(args) > 2 else None
    try:
        if _retried():
            return f"not restarted {host_id}: its first attempt was lost (the host is reported lost)"
        import asyncio

        return asyncio.run(_serve(scheduler, host_id, security))
    except BaseException as exc:          # noqa: BLE001 - see the module docstring
        return f"failed {host_id}: {type(exc).__name__}: {exc}"


async def _serve(scheduler: str, host_id: str, security=None) -> str:
    from distributed import Worker

    # ``security``: the deployment's distributed.Security on a TLS cluster (the worker then
    # listens with TLS too: its protocol follows the scheduler address's).
    worker = await Worker(scheduler, nthreads=1, name=host_id, dashboard=False, death_timeout=DEATH_TIMEOUT_S,
                          security=security)
    await worker.finished()
    return f"closed {host_id}"


def _retried() -> bool:
    """True in a second attempt of the lease task: Spark retries a task whose executor died,
    and a second Dask worker under the same host name would be an orphan."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    context = TaskContext.get()
    return context is not None and context.attemptNumber() > 0


def executor_of_this_process() -> dict:
    """The Spark executor this process runs under: ``{"executor_id", "executor_pid", "pid"}``.

    Found by walking up the process tree to the executor JVM
    (``CoarseGrainedExecutorBackend --executor-id N``); empty fields outside Spark.
    """
    import os

    import psutil

    for parent in psutil.Process().parents():
        try:
            cmd = parent.cmdline()
        except psutil.Error:
            continue
        if "--executor-id" in cmd:
            return {"executor_id": cmd[cmd.index("--executor-id") + 1], "executor_pid": parent.pid,
                    "pid": os.getpid()}
    return {"executor_id": "", "executor_pid": 0, "pid": os.getpid()}
