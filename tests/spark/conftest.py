"""A Spark standalone cluster for the whole session: a master and two single-core workers.

Started once and stopped by this fixture by PID (workers, master, and every
executor process seen under the workers); the fixture then checks that none
of those processes is left.
"""

from __future__ import annotations

import pytest
from waiting import gone


@pytest.fixture(scope="session")
def spark_cluster():
    from pescheduler.resource_managers.spark_standalone import StandaloneCluster

    cluster = StandaloneCluster(workers=2, worker_memory="1g").start()
    try:
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.stop()
        gone(pids, 15, "the Spark processes this fixture started to exit")

