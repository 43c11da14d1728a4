"""A Spark standalone cluster on this machine: a master and single-core workers, stopped by PID.

The pyspark package has no start scripts (``sbin/``), so the master and the
workers are started with ``spark-class`` from the pyspark distribution, which
``exec``s the JVM: the PID we keep is the JVM's. Daemons and executors get
light JVM flags (``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``, small heaps):
several JVMs share a small machine. Stopping a worker stops its executors
(the worker's shutdown hook kills them); the PIDs of executors are collected
before, so a caller can check that none outlives the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request

import psutil

from ..resources import ResourceManagerUnavailable
from . import processes

LIGHT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
POLL_S = 0.2


def spark_home() -> str:
    """The pyspark distribution's directory (it holds ``bin/spark-class`` and ``jars/``)."""
    try:
        import pyspark
    except ImportError:
        raise ResourceManagerUnavailable('spark: pyspark is not installed; pip install "pescheduler[spark]"') from None
    return os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)


def check_java() -> str:
    """The java binary Spark will use, or a clear error saying how to get one."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise ResourceManagerUnavailable("spark: Java is missing: install a JDK 17 or 21 (e.g. apt-get install "
                                         "openjdk-17-jre-headless) or set JAVA_HOME")
    return java


def daemon_env(log_dir: str) -> dict:
    # maxRetries=0: a busy port fails the daemon (reported with its log) instead of it moving
    # silently to the next port, where nobody would look for it. The master's REST submission
    # server is off: nothing here submits through it, and on its fixed port 6066 a second master
    # on the machine failed to bind it, after which that master never registered a worker.
    return {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": f"{LIGHT_JVM} -Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false", "SPARK_WORKER_DIR": os.path.join(log_dir, "work"),
            "SPARK_HOME": spark_home()}


class StandaloneCluster:
    """A master and ``workers`` single-core workers offering ``worker_memory`` each.

    Each daemon is started ``tied`` (``processes.start``): the kernel stops it when the process
    that started the cluster dies, even killed before it could stop it (a deploying process, a
    test session). Nothing in a master or worker watches that process."""

    def __init__(self, workers: int = 2, worker_memory: str = "1g", log_dir: str | None = None) -> None:
        self.n_workers = workers
        self.worker_memory = worker_memory
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="pescheduler-spark-")
        self.master: processes.Process | None = None
        self.workers: list[processes.Process] = []
        self.master_url = ""
        self.ui_url = ""
        self.executors: dict[int, psutil.Process] = {}     # psutil refuses to signal a reused PID
        self.aborted = False        # set from another thread: a start in progress gives up and stops

    def abort(self) -> None:
        """Make a ``start`` running in another thread give up at its next poll (it then stops what it began)."""
        self.aborted = True

    def start(self, timeout: float = 90.0) -> "StandaloneCluster":
        """Start the master, then the workers; returns once every worker is ALIVE at the master."""
        check_java()
        env = daemon_env(self.log_dir)
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        port, ui = processes.free_port(), processes.free_port()
        deadline = time.monotonic() + timeout
        try:
            self.master = processes.start("spark-master", [
                spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(port), "--webui-port", str(ui)], env, self.log_dir, tied=True)
            self.master_url, self.ui_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}"
            self._await(lambda: self._master_says(self.master_url), self.master, deadline,
                        f"the Spark master did not come up on port {port}")
            for i in range(self.n_workers):
                self.workers.append(processes.start(f"spark-worker-{i}", [
                    spark_class, "org.apache.spark.deploy.worker.Worker", "--cores", "1",
                    "--memory", self.worker_memory, "--webui-port", str(processes.free_port()),
                    self.master_url], env, self.log_dir, tied=True))
            self._await(lambda: len(self.alive_workers()) >= self.n_workers, None, deadline,
                        f"{self.n_workers} Spark workers did not register with the master")
        except BaseException:
            self.stop()
            raise
        return self

    def _await(self, ready, proc, deadline: float, what: str) -> None:
        """Poll ``ready`` until the deadline (no event exists for it); a dead process fails at once."""
        while not ready():
            if self.aborted:
                raise ResourceManagerUnavailable("spark: the standalone cluster's start was aborted")
            dead = [p for p in ([proc] if proc else self.workers) if not p.alive()]
            if dead:
                raise ResourceManagerUnavailable(f"spark: {what}: {dead[0].name} exited "
                                                 f"(port busy?). Its log {dead[0].log_path} ends:\n"
                                                 f"{dead[0].log_tail(15)}")
            if time.monotonic() >= deadline:
                raise ResourceManagerUnavailable(f"spark: {what} in time; logs in {self.log_dir}")
            time.sleep(POLL_S)

    def state(self) -> dict:
        """The master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return json.load(r)

    def _master_says(self, url: str) -> bool:
        """Our master answers on its UI port (not another process that holds the port)."""
        try:
            return self.state().get("url") == url
        except (OSError, ValueError):
            return False

    def alive_workers(self) -> list[dict]:
        try:
            return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def pids(self) -> list[int]:
        """Every JVM this cluster started, and the executors (with their children) seen so far."""
        self.note_executors()
        mine = [p.pid for p in ([self.master] if self.master else []) + self.workers]
        return mine + sorted(self.executors)

    def note_executors(self) -> None:
        """Remember the PIDs of processes the workers started (executor JVMs, their Python)."""
        for w in self.workers:
            try:
                self.executors.update((c.pid, c) for c in psutil.Process(w.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> None:
        """Workers first (they stop their executors), then the master; by PID, bounded."""
        self.note_executors()
        for w in self.workers:
            w.stop()
        if self.master is not None:
            self.master.stop()
        for proc in self.executors.values():        # an executor left behind by a killed worker
            try:
                proc.terminate()
                proc.wait(5)
            except psutil.TimeoutExpired:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
