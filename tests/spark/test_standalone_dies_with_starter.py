"""A Spark standalone cluster goes with the process that started it, even one killed before it could
stop the cluster: a deploying process whose ``spark`` resource manager started one (from a passing
thread, as the manager does), or the test session's fixture."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psutil
import pytest
from debian import require
from waiting import gone, reap

pytestmark = pytest.mark.spark

STARTS_A_CLUSTER = """
import json, sys, threading
from pescheduler.resource_managers.spark_standalone import StandaloneCluster

cluster = StandaloneCluster(workers=1, worker_memory="512m")
starting = threading.Thread(target=cluster.start)       # a passing thread, as the resource manager's
starting.start()
starting.join()
daemons = [cluster.master, *cluster.workers]
print(json.dumps([[d.pid, d.log_path] for d in daemons]), flush=True)     # the daemons it started, their logs
sys.stdin.read()                                # until the test kills this process
"""


def test_a_cluster_started_from_a_passing_thread_lives_on_and_stops_when_its_starter_is_killed():
    """Each daemon is started ``tied`` (``processes.start``): through ``setpriv --pdeathsig``, from
    one thread that lives as long as the process. So the daemons outlive the thread that asked for
    them (a pdeathsig set from it would have stopped the JVMs within about a second of its end),
    and a SIGKILL of the process has the kernel send each SIGTERM (``spark-class`` execs the JVM,
    which keeps it). Before, a deploying process killed this way left the master and worker
    running, and the test session's cluster was tied by a launcher of the fixture's own."""
    require("setpriv", "util-linux")
    starter = subprocess.Popen([sys.executable, "-c", STARTS_A_CLUSTER],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    daemons: list[psutil.Process] = []        # held while alive: psutil will not signal a reused PID
    try:
        started = json.loads(starter.stdout.readline() or "[]")
        pids = [pid for pid, _log in started]
        daemons = [psutil.Process(p) for p in pids]
        assert len(daemons) == 2, "the starter printed no master and worker"
        # A signal that should not come has no event to await: none of them exits within 3 s of the
        # thread's end, nor logs a signal (a Spark daemon logs "RECEIVED SIGNAL TERM" as one comes,
        # before its shutdown, which took longer than 3 s on a loaded machine)
        ended, _ = psutil.wait_procs(daemons, timeout=3)
        assert not ended, f"{[p.pid for p in ended]} exited when the thread that started them ended"
        for _pid, log in started:
            with open(log, errors="replace") as f:
                assert "RECEIVED SIGNAL" not in f.read(), f"{log}: signalled when the thread that started it ended"
        starter.send_signal(signal.SIGKILL)
        starter.wait(30)
        gone(pids, 60, "the master and worker to exit after their starter was killed")
    finally:
        reap(starter)
        for daemon in daemons:                  # left only if the test failed: stopped by PID
            try:
                daemon.kill()
            except psutil.NoSuchProcess:
                pass
