"""Fixtures of the unit tests: the pescheduler.ep providers, a real PostgreSQL among them."""

from __future__ import annotations

import gc

import pytest

PROVIDERS = ["native", "sqlite", "duckdb", pytest.param("postgresql", marks=pytest.mark.database)]


@pytest.fixture(scope="session")
def postgres_url():
    """A PostgreSQL server of its own for the session (tests/pg_server.py), stopped at the end."""
    from pg_server import running

    with running() as url:
        yield url


@pytest.fixture(params=PROVIDERS)
def provider(request):
    """What ``ep.EventProcessor(provider=...)`` takes, for every provider in turn."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_url")
    return request.param


@pytest.fixture(params=["memory", "disk"])
def backend(request, tmp_path):
    """The keyed state backend an operator opened in the test keeps its state in, each in turn."""
    import dask

    with dask.config.set({"pescheduler.state.backend": request.param, "pescheduler.state.dir": str(tmp_path)}):
        yield request.param


@pytest.fixture
def no_automatic_collection():
    """The collector on, its automatic young collections out of the way (a threshold no test
    reaches): what generation an object is in is then what the code under test made it."""
    was = gc.get_threshold()
    gc.set_threshold(10**9, 10**9, 10**9)
    yield
    gc.set_threshold(*was)
    from pescheduler import collector

    collector.thaw()        # through the module, which knows it froze


@pytest.fixture
def freezing(monkeypatch):
    """This process freezes survivors, as a worker does (``pe.gc-freeze``)."""
    from pescheduler import collector

    monkeypatch.setattr(collector, "_installed", collector._FreezeAfterFull(600))
