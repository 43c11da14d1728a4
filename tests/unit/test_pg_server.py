"""tests/pg_server.py leaves no server behind, even when the test process is SIGKILLed mid-test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

import pg_server
from waiting import gone, reap, until

pytestmark = pytest.mark.database

TESTS = Path(__file__).parent.parent


def test_a_sigkilled_test_run_leaves_no_postgres_and_the_next_start_removes_its_dir(tmp_path):
    """The child run keeps its server's dir in a temp directory of its own (``TMPDIR``): any other
    ``running()`` on this machine (another worker of a parallel run, another developer's run)
    removes stale dirs first, and would take the SIGKILLed run's from this test's own check."""
    url_file = tmp_path / "url"
    base = tempfile.mkdtemp(prefix="pescheduler-pgtest-")
    os.chmod(base, 0o755)               # as root, the server runs as postgres: it must reach its dir
    (tmp_path / "test_holds_a_server.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from pg_server import running

        def test_holds_a_server():
            with running() as url:
                open({str(url_file)!r} + ".part", "w").write(url)
                __import__("os").rename({str(url_file)!r} + ".part", {str(url_file)!r})
                sys.stdin.read()          # held until the parent kills this run
    """))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
                            str(tmp_path / "test_holds_a_server.py")],
                           cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": base})
    try:
        until(lambda: url_file.exists() or run.poll() is not None, 180, "the child run's server")
        assert run.poll() is None, "the child pytest run ended before holding a server"
        sock = url_file.read_text().split("host=")[1].split("&")[0]
        tmp = os.path.dirname(sock)
        data = os.path.join(tmp, "data")
        postmaster = pg_server._postmaster(data)
        assert postmaster is not None, f"no postgres runs on {data}"
        server_pids = [postmaster.pid, *(c.pid for c in postmaster.children())]

        os.kill(run.pid, signal.SIGKILL)
        run.wait(30)
        gone(server_pids, 60, "the postgres of the SIGKILLed run (its parent-death signal)")
        assert not [p.pid for p in psutil.process_iter(["cmdline"]) if data in (p.info["cmdline"] or [])]
        assert os.path.isdir(tmp), "the SIGKILLed run had no chance to remove its dir"

        assert os.path.dirname(tmp) == base
        assert tmp in pg_server.remove_stale(base)
        assert not os.path.exists(tmp)
    finally:
        reap(run)
        pg_server.remove_stale(base)     # a failed check leaves no server either
        shutil.rmtree(base, ignore_errors=True)


def test_the_dir_of_a_live_run_is_not_stale(postgres_url):
    tmp = os.path.dirname(postgres_url.split("host=")[1].split("&")[0])
    assert tmp not in pg_server.remove_stale()
    assert pg_server._postmaster(os.path.join(tmp, "data")) is not None


def test_a_step_of_the_wall_clock_leaves_a_live_owners_dir_alone(tmp_path, monkeypatch):
    """A live owner's dir, then the wall clock stepped by 5 s (psutil's ``create_time`` is the
    process's start since boot plus the boot time in wall-clock seconds, so it moves with it): the
    owner is still alive by ``pescheduler.process_start``, and ``remove_stale`` leaves its dir.
    (By ``create_time`` alone it looked gone: a loaded suite's ``remove_stale`` removed three live
    servers' dirs.) A dead owner's dir still goes."""
    from pescheduler.process_start import started

    live, dead = tmp_path / f"{pg_server.PREFIX}live", tmp_path / f"{pg_server.PREFIX}dead"
    me = psutil.Process()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone_start = started(child.pid)     # (it runs until its stdin closes)
    child.stdin.close()
    child.wait(30)
    for path, pid, start in ((live, me.pid, started(me.pid)), (dead, child.pid, gone_start)):
        path.mkdir()
        (path / "owner").write_text(json.dumps({"pid": pid, "started": me.create_time(), "start": start}))
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 5.0)
    assert pg_server.remove_stale(str(tmp_path)) == [str(dead)]
    assert live.is_dir() and not dead.exists()
