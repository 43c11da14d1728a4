"""Finding the Dask workers a host brought: by the names the resource manager gave them; and the
TLS flags a ``dask worker`` command needs to join a TLS cluster.

The scheduler offers no event for "a worker named X joined" to a client, so this
polls its identity every ``POLL_S`` until a deadline (or until ``gone()`` says
the process that should run the worker has died, so a failed start is reported
at once instead of at the deadline). An in-process scheduler can say when a
worker joins (``joined``, the embedded cluster's plug-in): the identity is then
read again at once, not at the end of the poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)

POLL_S = 0.1


async def named_workers(client, names: list[str], timeout: float,
                        gone: Callable[[], str | None] = lambda: None,
                        joined: asyncio.Event | None = None) -> dict[str, str]:
    """``{name: address}`` of the workers called ``names`` once all have joined.

    Raises ``TimeoutError`` (with what is missing) at ``timeout``, or
    ``RuntimeError`` with ``gone()``'s reason when that returns one.
    ``joined``: set (on this loop) whenever a worker joins the scheduler; each one wakes the
    wait at once (a deploy's workers join in 20-50 ms, and the poll found them 0.1 s later).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if joined is not None:
            joined.clear()          # before the read: a join while it runs wakes the next wait
        info = await client.scheduler.identity(n_workers=-1)
        found = {str(w.get("name")): address for address, w in info["workers"].items()}
        if all(n in found for n in names):
            return {n: found[n] for n in names}
        reason = gone()
        if reason:
            raise RuntimeError(reason)
        if loop.time() >= deadline:
            missing = ", ".join(n for n in names if n not in found)
            raise TimeoutError(f"workers {missing} did not join the scheduler within {timeout:.0f} s")
        if joined is None:
            await asyncio.sleep(POLL_S)
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(joined.wait(), POLL_S)     # the poll stays: gone() is checked


async def retire(client, addresses: list[str], timeout: float) -> None:
    """Close the workers at ``addresses`` gracefully (they hold no PEs any more), bounded."""
    if addresses:
        await asyncio.wait_for(client.retire_workers(workers=list(addresses), close_workers=True,
                                                     remove=True), timeout)


async def start_hosts(start: Callable[[str], Awaitable], ids: list[str]) -> list:
    """Start the hosts ``ids`` at once with ``start(host_id)``; the ones that came up (not None)."""
    started = await asyncio.gather(*(start(h) for h in ids))
    return [h for h in started if h is not None]


async def retire_quietly(client, host, manager: str) -> None:
    """Retire ``host``'s workers, bounded; a failure is only logged (the manager then stops its
    processes by PID anyway)."""
    try:
        await retire(client, list(host.workers), timeout=10)
    except Exception as exc:
        logger.warning("%s: retiring %s failed: %s", manager, host.host_id, exc)
def tls_flags(security, folder: str) -> list[str]:
    """``dask worker``'s ``--tls-ca-file/--tls-cert/--tls-key`` for ``security`` (a
    ``distributed.Security``; none: ``[]``). Certificates given as PEM text (``Security.temporary()``)
    are written to files readable only by this user in ``folder``, which the caller removes.

    Each start of a worker writes them again (the same text), while a worker started before may be
    reading them: each is written beside its name and renamed over it, so a reader opens the old
    file or the new one, whole. Written in place, a worker read a truncated CA file and exited
    ("no certificate or crl found"; the loaded suite's docs/security.md snippet)."""
    if security is None:
        return []
    flags = []
    for flag, value in (("--tls-ca-file", security.tls_ca_file), ("--tls-cert", security.tls_worker_cert),
                        ("--tls-key", security.tls_worker_key)):
        if value and "-----BEGIN" in value:
            path = os.path.join(folder, flag.strip("-") + ".pem")
            fd, written = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")     # owner-only (0600)
            try:
                with open(fd, "w") as f:
                    f.write(value)
                os.replace(written, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(written)
                raise
            value = path
        flags += [flag, value]
    return flags
