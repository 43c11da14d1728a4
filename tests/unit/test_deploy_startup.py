"""``python -m pescheduler deploy`` on an embedded cluster starts the cluster's fork server before it
loads the app (the server imports distributed on another core meanwhile), and a broken app still
fails fast, exit 2, with that server stopped by PID: nothing the command started is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

# The app looks at what its deploying process has started by the time the app is loaded,
# notes it, and then fails as a broken app does.
BROKEN = """\
import json, os, psutil
me = psutil.Process()
servers = [p.pid for p in me.children() if "pescheduler.control.forkserver" in " ".join(p.cmdline())]
with open({seen!r}, "w") as f:
    json.dump({{"servers": servers, "distributed": "distributed" in __import__("sys").modules}}, f)
raise RuntimeError("this app is broken")
"""


def test_a_broken_app_exits_2_after_the_fork_server_started_and_leaves_nothing(tmp_path):
    seen = tmp_path / "seen.json"
    app = tmp_path / "broken.py"
    app.write_text(BROKEN.format(seen=str(seen)))
    result = subprocess.run([sys.executable, "-m", "pescheduler", "deploy", str(app)], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120,
                            env={**os.environ, "DASK_PESCHEDULER__STATE_DIR": str(tmp_path / "state")})
    assert result.returncode == 2, result.stderr
    assert "this app is broken" in result.stderr and "Traceback" not in result.stderr
    loaded = json.loads(seen.read_text())
    assert len(loaded["servers"]) == 1, f"no fork server was starting while the app loaded: {loaded}"
    assert not loaded["distributed"], "the control plane was imported before the app was checked"
    server = loaded["servers"][0]
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE, \
        f"the fork server {server} outlived the failed deploy"


def test_help_and_a_remote_deploy_start_no_fork_server():
    from pescheduler.control import forkserver

    started = []
    real, forkserver.shared = forkserver.shared, lambda: started.append(1)
    try:
        forkserver.prestart(["deploy", "app.py", "--cluster", "tcp://127.0.0.1:8786"])
        forkserver.prestart(["deploy", "app.py", "--cluster=tcp://127.0.0.1:8786"])
        forkserver.prestart(["deploy", "--help"])
        forkserver.prestart(["status", "cars"])
        assert started == []
        forkserver.prestart(["deploy", "app.py", "--workers", "2"])
        assert started == [1]
    finally:
        forkserver.shared = real
