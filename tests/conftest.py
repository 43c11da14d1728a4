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


def pytest_collection_finish(session):
    """Refuse a run in which a directory of this repository, put on ``sys.path`` by a test module,
    holds a module named like an installed package: every later ``import`` of that package would get
    ours. (``bench/kafka.py`` did so once, and every Kafka test after the one that put ``bench/``
    first failed with "'kafka' is not a package".) Load such a module by its path instead."""
    import importlib.metadata
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    installed = {name: dists for name, dists in importlib.metadata.packages_distributions().items()
                 if "pescheduler" not in dists}
    for entry in sys.path:
        folder = Path(entry or ".").resolve()
        if (folder == root or root in folder.parents) and folder.is_dir():
            for child in folder.iterdir():
                name = child.stem if child.suffix == ".py" else child.name
                if name in installed and (child.suffix == ".py" or (child / "__init__.py").exists()):
                    raise pytest.UsageError(
                        f"{child} shadows the installed {installed[name][0]} ({name}): {folder} is on "
                        "sys.path; load a module from it by its path (importlib.util.spec_from_file_location)")
