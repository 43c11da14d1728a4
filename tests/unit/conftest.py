"""Fixtures of the unit tests: the pescheduler.ep providers, a real PostgreSQL among them."""

from __future__ import annotations

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
