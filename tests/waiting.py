"""Bounded waits for tests: one helper for state that has no event (and its twin for a test's own
event loop), one for processes that do,
one that ends a process a test started if it is still running, one that kills a
deployment's worker and waits for the restore, one that runs
``python -m pescheduler deploy`` as a user types it, to its end, and two that say
which checkpoints are complete (a deployment's record, or the manifests in a storage
folder that a running deployment prunes).

``until`` polls: a resource manager's view, Spark's and the deployment's
records change in other threads and processes and signal nothing a test can
await. Processes do signal their exit, so ``gone`` waits on that
(``psutil.wait_procs``) instead of polling.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

POLL_S = 0.05


def until(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until true, or fail after ``timeout`` s saying what did not happen."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(POLL_S)


async def until_async(predicate, timeout: float, what: str, poll: float = 0.002) -> None:
    """``until`` for a test whose PEs run on its own event loop: yields to the loop between polls."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(poll)


def snapshot_until(dep, predicate, timeout: float, what: str):
    """The first monitor snapshot of deployment ``dep`` for which ``predicate`` holds; each one
    is awaited (no polling), and the whole wait is bounded by ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = dep.next_snapshot(timeout=timeout)
        if predicate(snap):
            return snap
    raise AssertionError(f"not within {timeout} s: {what}")


def processed(op):
    """A snapshot predicate: operator ``op`` exists and has taken tuples in."""
    return lambda snap: op in snap.operators and snap.operators[op].tuples_in > 0


def gone(pids, timeout: float, what: str) -> None:
    """Wait (bounded) for every process in ``pids`` to exit; zombies count as exited."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    left = [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"timed out after {timeout} s waiting for {what}: {left} still running"


def killed_and_restored(dep, pid: int, timeout: float) -> None:
    """SIGKILL a worker of ``dep`` by its PID, then wait (bounded) for the deployment's next restore."""
    before = len(dep.status()["checkpoints"]["restart"]["restarts"])
    os.kill(pid, signal.SIGKILL)
    until(lambda: len(dep.status()["checkpoints"]["restart"]["restarts"]) > before, timeout,
          f"the restore after the SIGKILL of worker process {pid}")


def reap(popen) -> None:
    """In a test's ``finally``: kill a ``subprocess.Popen`` the test started (by its PID) if it
    still runs (the test failed before it ended), and collect it."""
    if popen.poll() is None:
        popen.kill()
        popen.wait()


def deploy_cli(app_file, cwd, *args: str, timeout: float = 600, meanwhile=lambda: None):
    """``python -m pescheduler deploy APP_FILE ARGS`` in ``cwd``, to its end (exit 0 asserted):
    its stdout, and what ``meanwhile()`` returned, computed while the deployment runs."""
    proc = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(app_file), *args],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        extra = meanwhile()
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        reap(proc)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    return stdout, extra


def newest_checkpoint(dep) -> int:
    """The id of the deployment's newest complete checkpoint (0: none yet): what a test waits to grow."""
    done = dep.checkpoints()
    return done[-1]["id"] if done else 0


def manifests(storage) -> list[Path]:
    """Every complete checkpoint's manifest under the folder ``storage`` (any layout), oldest
    first. Read while a deployment prunes it: pathlib's glob (Python 3.11) raises when a folder it
    walks is removed meanwhile (a loaded suite, session 78: a pruned ``chk-*``), ``glob.glob`` skips it."""
    found = glob.glob(os.path.join(glob.escape(str(storage)), "**", "chk-*", "MANIFEST.json"), recursive=True)
    return sorted(map(Path, found), key=lambda p: p.parent.name)
