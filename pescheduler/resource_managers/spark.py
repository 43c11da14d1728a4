"""``spark``: hosts are executors of a PySpark application with dynamic allocation.

Spark keeps its own accounting: the streaming app borrows capacity the way a
batch job would, by running tasks. Borrowing a host is one single-partition
job, in its own job group, whose task runs a Dask worker inside the executor
(:mod:`.spark_lease`) until that worker closes; dynamic allocation starts an
executor for it and keeps it while the task runs. Returning a host retires its
Dask worker, so the task ends and the executor is free for Spark's own work
(then released after ``executor-idle-timeout``); cancelling the job group is
the fallback for a lease that does not end.

Spark wanting a host back is *batch demand*: tasks of other jobs of this
application pending with no free slot while executors are at
``max-executors``. It is read from ``sc.statusTracker()`` every
``poll-interval`` (0.1–0.5 s to notice) and becomes ``HostReturnRequested``
for the newest lease. Jobs of *another* Spark application are visible only in
the master's JSON, slowly and coarsely; they are not detected.

Not used, on purpose: ``killExecutors`` (refused under dynamic allocation),
``requestExecutors`` (executors churn), barrier mode (refused).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from dask.utils import parse_timedelta

from .. import config
from ..dask_client import close_client
from ..resources import (Host, HostLost, HostReturnRequested, ResourceManagerUnavailable)
from .spark_standalone import LIGHT_JVM, StandaloneCluster, check_java, spark_home
from .workers import named_workers, retire

logger = logging.getLogger(__name__)

LEASE_GROUP = "pescheduler-lease-"
ABANDON_S = 30.0      # how long a start given up is waited for before its JVMs are stopped without it
STOP_S = 60.0         # how long the application's stop (context, driver, cluster) is waited for, the same way


@dataclass
class _Lease:
    host_id: str
    thread: threading.Thread | None = None
    host: Host | None = None
    outcome: str = ""
    asked: bool = False          # a return request was raised for it
    returning: bool = False      # it is being given back: its end is not a loss
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def group(self) -> str:
        return LEASE_GROUP + self.host_id


@dataclass(frozen=True)
class Demand:
    """Batch work of this application now: tasks waiting for a slot and tasks running."""

    pending: int = 0
    running: int = 0


def batch_demand(tracker, lease_jobs: set[int]) -> Demand:
    """Tasks of active jobs that are not leases, from a ``StatusTracker`` (pure reads)."""
    pending = running = 0
    active = set(tracker.getActiveStageIds())        # a stage waiting for its parents has no tasks yet
    for job_id in tracker.getActiveJobsIds():
        job = None if job_id in lease_jobs else tracker.getJobInfo(job_id)
        for stage_id in (job.stageIds if job else ()):
            stage = tracker.getStageInfo(stage_id) if stage_id in active else None
            if stage is None:
                continue
            running += stage.numActiveTasks
            pending += max(0, stage.numTasks - stage.numActiveTasks - stage.numCompletedTasks)
    return Demand(pending, running)


def spark_conf(master: str, s: dict, local: bool = False) -> dict:
    """The application's settings: dynamic allocation that lets leases hold executors.

    ``local``: the cluster runs on this machine, so the driver listens on the loopback only.
    """
    s = config.section("rm.spark", s)
    conf = {
        "spark.master": master, "spark.app.name": "pescheduler",
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.timeout": "10s",
        "spark.dynamicAllocation.minExecutors": "0",
        "spark.dynamicAllocation.maxExecutors": str(s["max-executors"]),
        "spark.dynamicAllocation.executorIdleTimeout": str(s["executor-idle-timeout"]),
        "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",     # whole seconds only
        "spark.standalone.executorRemoveDelayOnDisconnection": "0s",
        "spark.executor.cores": "1", "spark.executor.memory": "512m",
        "spark.executor.extraJavaOptions": LIGHT_JVM,
        "spark.driver.memory": "512m", "spark.driver.extraJavaOptions": LIGHT_JVM,
        "spark.python.task.killTimeout": "100ms",
        "spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable,
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "true",     # its REST API lists executors (a reused driver JVM may say otherwise)
        # executors import what the deploying process imports (app modules, plug-ins)
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    if local:
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    conf.update({k: str(v) for k, v in s["conf"].items()})
    return conf


class SparkResourceManager:
    """Hosts lent by a Spark application with dynamic allocation; see the module docstring."""

    name = "spark"

    def __init__(self, scheduler_address: str, settings: dict | None = None, security=None) -> None:
        s = config.section("rm.spark", settings)      # defaults: pescheduler.yaml only
        self.settings = s
        self.scheduler_address = scheduler_address
        self.security = security                      # distributed.Security of a TLS cluster, or None
        self.max_executors = int(s["max-executors"])
        self.lease_timeout = parse_timedelta(s["lease-timeout"], default="seconds")
        self.poll_s = parse_timedelta(s["poll-interval"], default="seconds")
        self.return_within = parse_timedelta(s["return-within"], default="seconds")
        self.cluster: StandaloneCluster | None = None
        self.sc = None
        self.leases: dict[str, _Lease] = {}
        self.demand = Demand()
        self._ids = itertools.count(1)
        self._client = None
        self._on_event = None
        self._poller: asyncio.Task | None = None
        self._own_gateway = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aborted = False                  # the start was given up (set from the event loop)
        self._start_done = False               # the starting thread has finished
        self._start_lock = threading.Lock()
        self._started_at = 0.0                 # time.time() of the start: driver JVMs launched since are ours

    # -- the ResourceManager protocol ---------------------------------------------------
    async def start(self, on_event) -> None:
        from distributed import Client

        self._on_event, self._loop = on_event, asyncio.get_running_loop()
        self._started_at = time.time()
        starting = _in_daemon_thread(self._start_spark, "pescheduler-spark-start")
        try:
            await asyncio.shield(starting)
            self._client = await Client(self.scheduler_address, asynchronous=True, timeout=10,
                                        set_as_default=False, security=self.security)
        except BaseException:
            # Cancelled (the app ended first) or failed. A thread cannot be cancelled: if it still
            # runs, it is told to give up and stops what it started itself (see _start_spark), and
            # _abandon makes it end, bounded; otherwise close stops it here.
            with self._start_lock:          # the thread makes self.cluster under this lock too
                self._aborted = True
                running = not self._start_done
                if running and self.cluster is not None:
                    self.cluster.abort()
            if running:
                await self._abandon(starting)
            else:
                await self.close()
            raise
        self._poller = asyncio.create_task(self._poll())

    async def _abandon(self, starting: asyncio.Future) -> None:
        """The start was given up while its thread runs. No flag reaches it inside SparkContext's
        creation, which waits for the master's answer (a minute of retries when the master has
        gone, and longer loaded: a Ctrl-C'd deploy waited that long to exit, for the thread).
        The driver JVM it launched is killed by PID, so the py4j call in progress fails and the
        thread ends, stopping what it started. Bounded: after ``ABANDON_S`` its cluster is
        stopped from here, said loudly, and the thread (a daemon) is left to the process's exit."""
        deadline = time.monotonic() + ABANDON_S
        while not starting.done() and time.monotonic() < deadline:
            if self._own_gateway:
                await asyncio.to_thread(_kill_drivers_since, self._started_at)
            await asyncio.wait([starting], timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        if starting.done():
            if not starting.cancelled() and starting.exception() is not None:    # retrieved: expected here
                logger.info("spark: the start given up ended: %s", starting.exception())
            return
        logger.error("spark: the start given up is still running after %g s (in %s); stopping its "
                     "JVMs by PID and leaving the thread to the process's exit", ABANDON_S,
                     "SparkContext's creation" if self._own_gateway else "the standalone cluster's start")
        await asyncio.to_thread(_kill_drivers_since, self._started_at)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)

    def lendable(self) -> int:
        if self.sc is None or self.demand.pending:
            return 0
        return max(0, self.max_executors - len(self.leases) - self.demand.running)

    async def request_hosts(self, n: int) -> list[Host]:
        leases = [self._lease(f"spark-{next(self._ids)}") for _ in range(min(n, self.lendable()))]
        granted = await asyncio.gather(*(self._joined(lease) for lease in leases))
        return [h for h in granted if h is not None]

    async def return_host(self, host: Host) -> None:
        lease = self.leases.get(host.host_id)
        if lease is None:
            return
        lease.returning = True
        try:
            await retire(self._client, list(host.workers), timeout=10)
        except Exception as exc:
            logger.warning("spark: retiring %s failed (%s); cancelling its job group", host.host_id, exc)
        await self._end(lease)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        for lease in list(self.leases.values()):
            if lease.host is not None:
                await self.return_host(lease.host)
            else:
                await self._end(lease)
        if self._client is not None:
            await close_client(self._client, config.get_seconds("calls.scheduler"))
        stopping = _in_daemon_thread(self._stop_spark, "pescheduler-spark-stop")    # not joined at exit
        try:
            await asyncio.wait_for(asyncio.shield(stopping), STOP_S)
        except asyncio.TimeoutError:
            logger.error("spark: stopping the application took more than %g s (a py4j call to its driver "
                         "unanswered); stopping its JVMs by PID", STOP_S)
            if self._own_gateway:
                await asyncio.to_thread(_kill_drivers_since, self._started_at)
            if self.cluster is not None:
                await asyncio.to_thread(self.cluster.stop)

    # -- Spark ---------------------------------------------------------------------------
    def _start_spark(self) -> None:
        """Start Spark (blocking); if the start was given up meanwhile, stop all it started, here."""
        try:
            self._start_spark_now()
        finally:
            with self._start_lock:
                self._start_done = True
                given_up = self._aborted
            if given_up:
                self._stop_spark()

    def _start_spark_now(self) -> None:
        """Start a standalone cluster (unless ``master`` is given) and the SparkContext (blocking)."""
        spark_home()                  # pyspark installed? (says how to install it if not)
        check_java()
        master = self.settings["master"]
        if not master:
            # Held before it starts, so a close from the event loop can abort and stop it; made
            # under the lock, so an abort that came first (during check_java) is not missed: the
            # cluster would start in full, then be stopped (the deploying process waited ~10 s).
            with self._start_lock:
                if self._aborted:
                    raise ResourceManagerUnavailable("spark: start aborted before the cluster was started")
                self.cluster = StandaloneCluster(int(self.settings["workers"]), str(self.settings["worker-memory"]))
            self.cluster.start()
            master = self.cluster.master_url
            self.max_executors = min(self.max_executors, self.cluster.n_workers)   # one core each
        if self._aborted:
            raise ResourceManagerUnavailable("spark: start aborted before the application was created")
        from pyspark import SparkConf, SparkContext

        local = master.startswith(("spark://127.", "spark://localhost"))
        if local:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # pyspark starts Python workers with $PYSPARK_PYTHON (default: python3 on the PATH), not with
        # the spark.pyspark.python setting: without this, executors in a virtualenv deploy run the
        # system Python and cannot import pescheduler.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        self._own_gateway = SparkContext._gateway is None
        try:
            conf = spark_conf(master, self.settings, local)
            self.sc = SparkContext(conf=SparkConf().setAll(list(conf.items())))
        except Exception as exc:
            raise ResourceManagerUnavailable(f"spark: cannot start the application on {master}: "
                                             f"{_java_error(exc)}") from exc
        self.sc.setLogLevel("WARN")

    def _stop_spark(self) -> None:
        """Stop the context, the driver JVM if we launched it, and the cluster we started (by PID)."""
        from pyspark import SparkContext

        if self.sc is not None:
            try:
                self.sc.stop()
            except Exception as exc:
                logger.warning("spark: stopping the context failed: %s", exc)
            self.sc = None
        if self._own_gateway:
            stop_driver_jvm()
        if self.cluster is not None:
            self.cluster.stop()

    def executors(self) -> list[dict]:
        """Spark's executor list (the driver's REST API): id, hostPort, activeTasks, isActive."""
        import json
        import urllib.request

        url = f"{self.sc.uiWebUrl}/api/v1/applications/{self.sc.applicationId}/executors"
        with urllib.request.urlopen(url, timeout=30) as r:    # a loaded driver answers slowly
            return [e for e in json.load(r) if e["id"] != "driver"]

    # -- leases ----------------------------------------------------------------------------
    def _lease(self, host_id: str) -> _Lease:
        """Start the job that holds an executor for ``host_id``, in its own thread and job group."""
        from .spark_lease import lease as lease_task

        lease = _Lease(host_id)
        # The Security travels with the task (a Security made by ``temporary()`` holds its PEM
        # text, so an executor on another machine needs no certificate files of its own).
        sc, args = self.sc, (self.scheduler_address, host_id, self.security)

        def run() -> None:
            try:
                sc.setJobGroup(lease.group, f"pescheduler host {host_id}", interruptOnCancel=True)
                lease.outcome = sc.parallelize([args], 1).map(lease_task).collect()[0]
            except Exception as exc:
                lease.outcome = f"cancelled {host_id}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            finally:
                self._loop.call_soon_threadsafe(self._lease_ended, lease)

        lease.thread = threading.Thread(target=run, name=f"spark-lease-{host_id}", daemon=True)
        self.leases[host_id] = lease
        lease.thread.start()
        return lease

    async def _joined(self, lease: _Lease) -> Host | None:
        """The lease's Dask worker joined: its host (with the executor it runs in), else None."""
        try:
            found = await named_workers(self._client, [lease.host_id], self.lease_timeout,
                                        lambda: lease.ended.is_set() and f"the lease ended: {lease.outcome}")
            address = found[lease.host_id]
            where = await self._client.run(_executor_info, workers=[address])
        except Exception as exc:
            logger.warning("spark: host %s not granted: %s", lease.host_id, exc)
            await self._end(lease)
            return None
        lease.host = Host(lease.host_id, (address,), dict(where.get(address, {})))
        return lease.host

    def _lease_ended(self, lease: _Lease) -> None:
        lease.ended.set()
        if self.leases.pop(lease.host_id, None) is not None and lease.host and not lease.returning:
            asyncio.ensure_future(self._on_event(HostLost(lease.host, f"its Spark task ended: {lease.outcome}")))

    async def _end(self, lease: _Lease) -> None:
        """Wait for the lease's job to end; cancel its job group if it does not within 5 s."""
        lease.returning = True
        try:
            await asyncio.wait_for(lease.ended.wait(), 5.0)
        except asyncio.TimeoutError:
            if self.sc is not None:
                await asyncio.to_thread(self.sc.cancelJobGroup, lease.group)
            try:
                await asyncio.wait_for(lease.ended.wait(), 15.0)
            except asyncio.TimeoutError:
                logger.warning("spark: lease %s did not end after cancelling its job group", lease.host_id)
        self.leases.pop(lease.host_id, None)

    # -- batch demand -------------------------------------------------------------------------
    async def _poll(self) -> None:
        """Read Spark's status every ``poll-interval``; batch work with no free slot wants a host."""
        while True:
            try:
                self.demand = await asyncio.to_thread(self._read_demand)
                await self._ask_back()
            except asyncio.CancelledError:
                raise
            except Exception as exc:       # a hiccup of the tracker must not end the polling
                logger.debug("spark: status poll failed: %s", exc)
            await asyncio.sleep(self.poll_s)

    def _read_demand(self) -> Demand:
        tracker = self.sc.statusTracker()
        lease_jobs = {j for lease in list(self.leases.values()) for j in tracker.getJobIdsForGroup(lease.group)}
        return batch_demand(tracker, lease_jobs)

    async def _ask_back(self) -> None:
        """One return request at a time, for the newest lease, while batch tasks find no slot."""
        held = [lease for lease in self.leases.values() if lease.host is not None]
        if not self.demand.pending or any(lease.asked or lease.returning for lease in held):
            return
        if len(self.leases) + self.demand.running < self.max_executors or not held:
            return                     # dynamic allocation can still start an executor for it
        newest = held[-1]
        newest.asked = True
        await self._on_event(HostReturnRequested(newest.host, time.time() + self.return_within))


def stop_driver_jvm() -> None:
    """Stop pyspark's driver JVM (the py4j gateway) by its PID and wait for it, so none outlives us.

    pyspark keeps that JVM for the life of the Python process; a long-lived
    process that starts and stops Spark applications would otherwise keep it
    (and, once this process exits, leave it to init as a zombie).
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:
        pass
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()
            proc.wait(10)
    SparkContext._gateway = SparkContext._jvm = None


def _in_daemon_thread(fn, name: str) -> asyncio.Future:
    """``fn()`` in a daemon thread, its outcome in the future returned: a blocked call there (a
    py4j call waiting for a JVM) does not hold the process's exit as ``asyncio.to_thread``'s
    would (the interpreter joins the default executor's threads at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(None)

    def run() -> None:
        outcome = None
        try:
            fn()
        except BaseException as exc:
            outcome = exc
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:           # the loop has closed: nobody waits any more
            pass
    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _kill_drivers_since(since: float) -> None:
    """Kill (by PID) pyspark driver JVMs this process launched at or after ``since`` (time.time()):
    a py4j call waiting on one then fails at once. Not waited for here: pyspark's ``launch_gateway``
    polls its ``Popen`` for the exit, and a child reaped by anyone else reads as running to it."""
    import psutil

    killed = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.create_time() >= since - 1 and "org.apache.spark.deploy.SparkSubmit" in proc.cmdline():
                proc.kill()
                killed.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    if killed:
        logger.warning("spark: the start was given up: killed its driver JVM (PIDs %s)", killed)


def _java_error(exc: Exception) -> str:
    """The line of a py4j error that says what Spark refused, not the Java stack."""
    lines = str(exc).splitlines()
    return next((line.lstrip(": ") for line in lines if "Exception:" in line), lines[0] if lines else repr(exc))


def _executor_info() -> dict:
    """Run on the lease's Dask worker: which executor it lives in (for the host's info)."""
    from pescheduler.resource_managers.spark_lease import executor_of_this_process

    return executor_of_this_process()
