"""Embedded workers forked from the fork server are what ``python -m distributed.cli.dask_worker`` was.

Each worker must see the deploying process as it is at the worker's start
(environment, ``PESCHEDULER__*`` settings, working directory, ``sys.path``),
not as it was when the fork server started; its stdout is the deploying
process's; it is stopped by PID and its exit code reaches the deploying process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import psutil
import pytest
from distributed import Client

from pescheduler.control.cluster import EmbeddedCluster
from pescheduler.control.forkserver import ForkServer

pytestmark = pytest.mark.integration


def test_a_forked_worker_sees_the_deploying_process_as_it_is_at_its_start(tmp_path, monkeypatch):
    async def main():
        cluster = EmbeddedCluster(1)
        try:
            address = await cluster.start()
            # Changed after the fork server started (it imported pescheduler's config already).
            monkeypatch.setenv("PESCHEDULER__BATCH__SIZE", "7")
            monkeypatch.setenv("H4_MARK", "set-late")
            monkeypatch.chdir(tmp_path)
            monkeypatch.syspath_prepend(str(tmp_path))
            async with Client(address, asynchronous=True) as client:
                await cluster.grow(client)
                names = await client.run(lambda dask_worker: dask_worker.name)
                late = next(address for address, name in names.items() if name == "embedded-1")

                def seen():
                    from pescheduler import config
                    import psutil
                    assert " ".join(psutil.Process().cmdline()).startswith("dask worker [")  # what ps shows
                    return (config.get("batch.size"), os.environ.get("H4_MARK"), os.getcwd(),
                            str(tmp_path) in sys.path, os.getpid(), os.getsid(0))

                batch, mark, cwd, on_path, pid, sid = (await client.run(seen, workers=[late]))[late]
            assert (batch, mark, cwd, on_path) == (7, "set-late", str(tmp_path), True)
            assert sid == pid                               # its own session: a terminal's Ctrl-C misses it
            assert psutil.Process(pid).parent().parent().pid == os.getpid()   # the server's child, ours below
        finally:
            await cluster.close()
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

    asyncio.run(main())


def test_exit_codes_and_stdout_reach_the_deploying_process_and_the_server_stops_on_close(tmp_path, capfd):
    server = ForkServer(str(tmp_path / "server.log"))
    try:
        version = server.spawn(["--version"], str(tmp_path / "a.log"))
        assert version.wait(60) == 0
        bad = server.spawn(["no-port"], str(tmp_path / "b.log"))
        assert bad.wait(60) == 1                                          # as the command line's
        assert "missing port number" in (tmp_path / "b.log").read_text()  # stderr: the worker's log
        assert "dask worker, version" in capfd.readouterr().out          # stdout: ours
        # Stopped by its pidfd: SIGTERM, then SIGKILL of one that ignores it is the owner's choice.
        hung = server.spawn(["tcp://127.0.0.1:9", "--death-timeout", "600"], str(tmp_path / "c.log"))
        assert hung.poll() is None and psutil.pid_exists(hung.pid)
        hung.kill()
        assert hung.wait(60) == -9
        hung.kill()                                                       # a second signal is harmless
        pid = server._server.pid
    finally:
        server.close()
    assert server._server.returncode == 0 and not psutil.pid_exists(pid)


SHARED = """
import asyncio, json, sys
from pescheduler.control import forkserver
from pescheduler.control.cluster import EmbeddedCluster

async def once():
    cluster = EmbeddedCluster(1)
    try:
        await cluster.start()
        return forkserver.shared()._server.pid, cluster._workers[0].pid
    finally:
        await cluster.close()

first, second = asyncio.run(once()), asyncio.run(once())
print(json.dumps({"servers": [first[0], second[0]], "workers": [first[1], second[1]],
                  "folder": forkserver._shared[1]}))
"""


def test_one_fork_server_serves_every_embedded_cluster_of_a_process_and_stops_at_its_exit(tmp_path):
    # Two embedded clusters one after the other (a script or test run deploying twice): the second
    # forks from the server the first started (no second import of distributed and pescheduler);
    # when the process exits, the server has been stopped and its log folder removed.
    done = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    (server, again), workers = seen["servers"], seen["workers"]
    assert server == again and workers[0] != workers[1]
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(seen["folder"])


def test_the_wait_for_the_workers_ends_when_they_join_not_at_the_next_poll(monkeypatch):
    # Every deploy waits for its workers on the way to its first output. With a poll of 60 s, a
    # wait that polled found the worker 60 s after its first look; the join wakes it (bounded at 30 s).
    from pescheduler.resource_managers import workers

    monkeypatch.setattr(workers, "POLL_S", 60.0)

    async def main():
        cluster = EmbeddedCluster(1)
        try:
            address = await cluster.start()
            async with Client(address, asynchronous=True) as client:
                await asyncio.wait_for(cluster.wait_for_workers(client), 30)
                info = await client.scheduler.identity(n_workers=-1)
                assert [w["name"] for w in info["workers"].values()] == ["embedded-0"]
        finally:
            await cluster.close()

    asyncio.run(main())
