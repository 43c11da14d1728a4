"""A Spark standalone cluster for the whole session: a master and two single-core workers.

Started once and stopped by this fixture by PID (workers, master, and every
executor process seen under the workers); the fixture then checks that none
of those processes is left.
"""

from __future__ import annotations

import time

import psutil
import pytest


def _alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="session")
def spark_cluster():
    from pescheduler.resource_managers.spark_standalone import StandaloneCluster

    cluster = StandaloneCluster(workers=2, worker_memory="1g").start()
    try:
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.stop()
        deadline = time.monotonic() + 15
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids), f"Spark processes left behind: {_alive(pids)}"

