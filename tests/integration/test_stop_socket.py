"""``stop NAME`` of an embedded deployment asks its deploying process on a Unix socket: no cluster
library is imported (issue 34: stop <= 0.3 s, of which importing distributed was 0.4 s); a stale
socket falls back to the scheduler's path."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys

import dask.config
import pytest

import pescheduler
from pescheduler.control import stopsocket

pytestmark = pytest.mark.integration

# `python -m pescheduler stop NAME` as runpy runs it, then which cluster libraries it had imported
# (said at exit: `stop` ends its process without the interpreter's teardown, atexit handlers run)
PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("LOADED:", *sorted(m for m in ("distributed", "tornado") if m in sys.modules)))
sys.argv = ["pescheduler", "stop", {name!r}, "--timeout", "90"]
runpy.run_module("pescheduler", run_name="__main__")
"""


def _deployed(tmp_path, name: str):
    app = pescheduler.Application(name)
    app.source("generator", events=None, keys=10, rate=1000).sink("jsonl", path=str(tmp_path / f"{name}.jsonl"))
    return pescheduler.deploy(app, workers=1, rm="none", policies=[], name=name)


def _stop(name: str, state_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(name=name)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PESCHEDULER__STATE_DIR": state_dir})


def test_stop_asks_on_the_socket_and_imports_no_cluster_library(tmp_path):
    state_dir = str(tmp_path / "state")
    with dask.config.set({"pescheduler.state-dir": state_dir}):
        with _deployed(tmp_path, "sock") as dep:
            path = stopsocket.socket_path("sock")
            stop = _stop("sock", state_dir)
            final = dep.wait(timeout=60)
            assert final["state"] == "stopped"
            assert any("stop requested from the command line" in e["text"] for e in final["events"])
        assert not os.path.exists(path)                  # removed with the deployment
    assert stop.stdout.splitlines()[-1] == "LOADED:", stop.stdout
    assert stop.returncode == 0 and "stopped (stopped)" in stop.stdout, stop.stdout + stop.stderr


def test_the_socket_is_its_users_only_and_answers_the_final_state(tmp_path):
    """The server alone (no cluster): mode 0600, "stop" calls the request once, the answer is the
    state once done; the file is gone after close."""
    asked = []

    async def main():
        done = asyncio.Event()

        async def request_stop():
            asked.append(1)
            done.set()
        server = await stopsocket.StopServer.start("alone", request_stop, done, lambda: "stopped")
        mode = stat.S_IMODE(os.stat(server.path).st_mode)
        answer = await asyncio.to_thread(stopsocket.ask_to_stop, "alone", 30)
        again = await asyncio.to_thread(stopsocket.ask_to_stop, "alone", 30)     # already ended
        await server.close()
        return mode, answer, again, os.path.exists(server.path)

    with dask.config.set({"pescheduler.state-dir": str(tmp_path)}):
        assert asyncio.run(asyncio.wait_for(main(), 60)) == (0o600, "stopped", "stopped", False)
    assert asked == [1]


def test_a_stale_socket_falls_back_to_the_scheduler(tmp_path):
    state_dir = str(tmp_path / "state")
    with dask.config.set({"pescheduler.state-dir": state_dir}):
        with _deployed(tmp_path, "stale") as dep:
            path = stopsocket.socket_path("stale")
            os.remove(path)                              # as if its listener died: a file nobody listens on
            dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            dead.bind(path)
            dead.close()
            stop = _stop("stale", state_dir)
            assert dep.wait(timeout=60)["state"] == "stopped"
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
    assert "distributed" in stop.stdout.splitlines()[-1]    # it went through the scheduler


def test_no_answer_is_none_within_the_bound(tmp_path, monkeypatch):
    """A socket that accepts but never answers (a hung process): None after ANSWER_S, not a hang."""
    monkeypatch.setattr(stopsocket, "ANSWER_S", 0.2)
    with dask.config.set({"pescheduler.state-dir": str(tmp_path)}):
        hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hung.bind(stopsocket.socket_path("hung"))
        hung.listen(1)
        try:
            assert stopsocket.ask_to_stop("hung", timeout=60) is None
            assert stopsocket.ask_to_stop("nobody", timeout=60) is None
        finally:
            hung.close()
