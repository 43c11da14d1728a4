"""A Spark standalone cluster for the whole session: a master and two single-core workers.

Started once and stopped by this fixture by PID (workers, master, and every
executor process seen under the workers); the fixture then checks that none
of those processes is left. A test process killed before its ``finally`` (a
run stopped by SIGTERM) leaves none either: the cluster starts each daemon
through ``setpriv --pdeathsig TERM`` (``processes.start``'s ``tied``), so the
kernel stops it when this process dies, and a worker so stopped stops its
executors.
"""

from __future__ import annotations

import pytest
from debian import require
from waiting import gone


@pytest.fixture(scope="session")
def spark_cluster():
    from pescheduler.resource_managers.spark_standalone import StandaloneCluster

    require("setpriv", "util-linux")          # what ties the daemons to this process
    cluster = StandaloneCluster(workers=2, worker_memory="1g").start()
    try:
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.stop()
        gone(pids, 15, "the Spark processes this fixture started to exit")

