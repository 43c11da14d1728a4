"""Shared fixtures: a real Dask LocalCluster for integration tests, started and closed here."""

from __future__ import annotations

import os
import sys

import pytest

# The scale tests (marker ``scale``) read PESCHEDULER_SCALE: the default run (CI's) is their
# bounded version, a tenth of the events or steps; ``PESCHEDULER_SCALE=1 python -m pytest -m scale``
# is the full one. Set here, before any test module reads it.
os.environ.setdefault("PESCHEDULER_SCALE", "0.1")


@pytest.fixture(autouse=True)
def _takes_left_their_indexes():
    """Each test ends with the memory state's leave thread idle: a take in one test (a rescale's,
    10^5-10^6 keys) would otherwise go on being paced out of its index in the next test of the same
    process, whose counts of ``key_groups`` calls and whose timings it joins."""
    yield
    memory = sys.modules.get("pescheduler.state.memory")
    if memory is not None:
        assert memory.leaves_done(60), "the memory state's leave thread still busy 60 s after the test"


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


# A parallel run (pytest-xdist: pyproject's addopts ``-n 3 --dist loadgroup``) hands each worker
# process whole groups of tests: a group runs on one worker, in file order, as in a serial run.
# A module is a group, so its module-scoped fixtures (brokers, databases, clusters, the bench
# smoke test's background runs of every bench) start once; a few modules share one:
#   spark  every test under tests/spark: one Spark standalone cluster for the run (its session
#          fixture), not one per worker, each with two JVM workers.
#   lab    the lab tests (network namespaces, cgroups with CPU quotas), the lab's cleanup test
#          and the bench smoke test (bench/elastic.py runs on lab hosts): lab hosts are given
#          their half core first, which holds only while one lab at a time asks for it.
SHARED_WORKER = {"test_lab": "lab", "test_lab_sizing": "lab", "test_lab_cleanup": "lab",
                 "test_bench_smoke": "lab"}


@pytest.hookimpl(tryfirst=True)       # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):          # a serial run, or xdist's controller
        return
    for item in items:
        path = item.path
        group = "spark" if path.parent.name == "spark" else SHARED_WORKER.get(path.stem, path.stem)
        item.add_marker(pytest.mark.xdist_group(group))


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
