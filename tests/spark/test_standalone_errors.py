"""A standalone cluster that cannot start says why, and leaves no process behind."""

from __future__ import annotations

import socket

import pytest

from pescheduler.resource_managers import processes, spark_standalone
from pescheduler.control.resources import ResourceManagerUnavailable

pytestmark = pytest.mark.spark


def test_a_busy_master_port_is_reported_with_the_masters_log(monkeypatch, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(processes, "free_port", lambda host="127.0.0.1": next(ports, 0) or _free())
        cluster = spark_standalone.StandaloneCluster(workers=1, log_dir=str(tmp_path))
        with pytest.raises(ResourceManagerUnavailable, match=r"spark-master exited \(port busy\?\)"):
            cluster.start(timeout=60)
    assert cluster.master.popen.returncode is not None          # it exited and was waited for


def _free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
