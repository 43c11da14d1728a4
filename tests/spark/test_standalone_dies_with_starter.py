"""The session's Spark cluster goes with the test process that started it, even one killed before its ``finally``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psutil
import pytest
from debian import dies_with_this_process
from waiting import gone, reap

pytestmark = pytest.mark.spark

STARTS_A_CLUSTER = """
import json, sys
from pescheduler.resource_managers.spark_standalone import StandaloneCluster

cluster = StandaloneCluster(workers=1, worker_memory="512m", launcher=json.loads(sys.argv[1])).start()
print(json.dumps([cluster.master.pid] + [w.pid for w in cluster.workers]), flush=True)     # the daemons it started
sys.stdin.read()                                # until the test kills this process
"""


def test_a_cluster_started_through_pdeathsig_stops_when_its_starter_is_killed():
    """SIGKILL of the process that started the master and worker: the kernel sends each SIGTERM
    (``setpriv --pdeathsig``; ``spark-class`` execs the JVM, which keeps it), and both exit. A
    run of the suite stopped by a signal left these JVMs running before (session 61)."""
    starter = subprocess.Popen([sys.executable, "-c", STARTS_A_CLUSTER, json.dumps(dies_with_this_process())],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    daemons: list[psutil.Process] = []        # held while alive: psutil will not signal a reused PID
    try:
        pids = json.loads(starter.stdout.readline() or "[]")
        daemons = [psutil.Process(p) for p in pids]
        assert len(daemons) == 2, "the starter printed no master and worker"
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
