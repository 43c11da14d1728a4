"""``pescheduler.pe.allocator``: what a worker process is started with (pescheduler/allocator.py).

The library lookup is replaced here; tests/integration/test_allocator.py starts real workers on it.
"""

from __future__ import annotations

import logging

import dask.config
import pytest

from pescheduler import allocator, config
from pescheduler.errors import ConfigError


@pytest.fixture()
def found(monkeypatch):
    monkeypatch.setattr(allocator, "_jemalloc_library", lambda: "libjemalloc.so.2")


def test_jemalloc_is_preloaded_before_what_the_user_preloads_and_only_once(found):
    assert allocator.preload_env({}) == {"LD_PRELOAD": "libjemalloc.so.2"}
    assert allocator.preload_env({"LD_PRELOAD": "libmine.so"}) == {"LD_PRELOAD": "libjemalloc.so.2 libmine.so"}
    assert allocator.preload_env({"LD_PRELOAD": "libmine.so libjemalloc.so.2"}) == \
        {"LD_PRELOAD": "libmine.so libjemalloc.so.2"}


def test_system_preloads_nothing(found):
    with dask.config.set({"pescheduler.pe.allocator": "system"}):
        assert allocator.preload_env({"LD_PRELOAD": "libmine.so"}) == {}


def test_without_jemalloc_the_workers_run_on_the_c_library_and_the_log_says_how_to_install_it(monkeypatch, caplog):
    monkeypatch.setattr(allocator, "_jemalloc_library", lambda: None)
    allocator._missing.cache_clear()
    with caplog.at_level(logging.WARNING, logger="pescheduler.allocator"):
        assert allocator.preload_env({}) == {}
        assert allocator.preload_env({}) == {}
    assert [r.getMessage() for r in caplog.records].count(
        "pescheduler.pe.allocator is jemalloc but no jemalloc library was found: workers run on the C "
        "library's malloc (on Debian: apt-get install -y libjemalloc2)") == 1      # said once


def test_another_allocator_is_a_configuration_error_naming_the_key_and_the_choices():
    with dask.config.set({"pescheduler.pe.allocator": "tcmalloc"}):
        with pytest.raises(ConfigError, match=r"pe.allocator: 'tcmalloc' is not valid; expected one of jemalloc, "
                                              r"system \(default jemalloc\)"):
            config.validate()
        with pytest.raises(ValueError, match="must be one of jemalloc, system"):
            allocator.preload_env({})
