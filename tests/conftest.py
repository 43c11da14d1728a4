"""Shared fixtures: a real Dask LocalCluster for integration tests, started and closed here."""

from __future__ import annotations

import os

import pytest

# The scale tests (marker ``scale``) read PESCHEDULER_SCALE: the default run (CI's) is their
# bounded version, a tenth of the events or steps; ``PESCHEDULER_SCALE=1 python -m pytest -m scale``
# is the full one. Set here, before any test module reads it.
os.environ.setdefault("PESCHEDULER_SCALE", "0.1")


@pytest.fixture(scope="session")
def cluster():
    """Scheduler address of a 3-worker LocalCluster (single-threaded worker processes).

    Started once per session and closed by this fixture, which stops the worker
    processes it started (the cluster object owns them; nothing is killed by name).
    """
    from distributed import LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as local:
        yield local.scheduler_address


def pytest_configure(config):
    # examples/ is importable in tests, so they exercise the examples as written.
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
