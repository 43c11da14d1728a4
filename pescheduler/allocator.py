"""Which ``malloc`` a worker process runs on: jemalloc where the machine has it, else the C library's.

Why: at 10^7 keys a checkpoint's writer, a rescale's packer and RocksDB allocate and free hundreds
of MB in a worker. glibc keeps what is freed inside its arenas, and giving it back (``malloc_trim``,
:class:`pescheduler.worker.ckpt_files.Trims`) takes each arena's lock in turn while it walks every
free chunk: traced at 10^7 keys on ``disk``, the worker's event loop waited 122 ms for that lock in
a heartbeat while a trim ran after the first checkpoint after a rescale, and the PE's input waited
with it (docs/state-log.md, session 29). jemalloc gives memory back as it decays, a little at a time in
threads of its own, never walking an arena whole under its lock; RocksDB recommends it, Redis ships
with it.

It is preloaded (``LD_PRELOAD``) into the worker processes a deploying process starts: the embedded
cluster's fork server (its forks inherit it) and the ``local`` and ``lab`` resource managers'
workers. A cluster started elsewhere (``--cluster ADDR``) runs what its workers were started with.
``pescheduler.pe.allocator``: ``jemalloc`` (the default; the C library's where no jemalloc is
found, said once in the log; on Debian ``apt-get install -y libjemalloc2``) or ``system``. A
worker's choice shows in ``dep.worker_info[worker]["allocator"]``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

from . import config

__all__ = ["in_use", "preload_env", "start_background_threads"]

logger = logging.getLogger(__name__)


@functools.cache
def _jemalloc_library() -> str | None:
    """The jemalloc shared library's name as the dynamic linker finds it (``ldconfig``), or None."""
    return ctypes.util.find_library("jemalloc")


def preload_env(environ: dict | None = None) -> dict[str, str]:
    """The environment a worker process is started with to run on the chosen allocator: what to add
    to ``environ`` (default ``os.environ``), nothing for ``system`` or where jemalloc is missing.
    ``ValueError`` for another value of ``pescheduler.pe.allocator``."""
    choice, choices = config.get("pe.allocator"), config.CHOICES["pe.allocator"]
    if choice not in choices:        # config.validate() says so before a deploy starts anything
        raise ValueError(f"pescheduler.pe.allocator must be one of {', '.join(choices)}, got {choice!r}")
    if choice == "system":
        return {}
    library = _jemalloc_library()
    if library is None:
        _missing()
        return {}
    preloaded = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    return {"LD_PRELOAD": preloaded if library in preloaded.split() else f"{library} {preloaded}".strip()}


@functools.cache
def _missing() -> None:
    logger.warning("pescheduler.pe.allocator is jemalloc but no jemalloc library was found: workers run on "
                   "the C library's malloc (on Debian: apt-get install -y libjemalloc2)")


@functools.cache
def _mallctl():
    """jemalloc's ``mallctl`` in this process's global symbols (preloaded), or None (looked up once:
    a process's allocator is fixed at its start)."""
    try:
        return ctypes.CDLL(None).mallctl
    except (AttributeError, OSError):
        return None


def in_use() -> str:
    """``jemalloc`` if this process runs on it, else ``system``."""
    return "jemalloc" if _mallctl() is not None else "system"


def start_background_threads() -> bool:
    """jemalloc's purging in threads of its own in this process (a worker, at its start): the PE's
    threads then never purge inside a ``malloc``. Not in the environment (``MALLOC_CONF``): the
    fork server would start them too, and it forks single-threaded. Whether they run; False on
    the C library's malloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return False
    on = ctypes.c_bool(True)
    return mallctl(b"background_thread", None, None, ctypes.byref(on), ctypes.c_size_t(ctypes.sizeof(on))) == 0
