"""`deploy --rm spark` leaves no JVM behind, however it ends: normal end, failure, Ctrl-C, SIGTERM.

The deploying process gets its own TMPDIR, so every process it starts (the
standalone master and workers, executors, the driver's gateway JVM, the
embedded cluster's workers) carries it in its environment and can be counted;
nothing else on this shared machine does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from waiting import reap

pytestmark = pytest.mark.spark

# The finite apps run 5 s: the deploying process stops a Spark start its run no longer needs at
# once, so a shorter run could end before Spark's first JVM and the test would prove nothing.
FINITE = """
from pescheduler import Application
app = Application("spark-cleanup")
app.source("generator", events=10_000, keys=10, seed=1, rate=2_000).sink("discard")
"""
FAILING = """
from pescheduler import Application
app = Application("spark-cleanup")
(app.source("generator", events=20_000, keys=10, seed=1, rate=2_000)      # event i has ts 1.7e12 + i ms
    .filter(lambda e: e["ts"] >= 1_700_000_016_000)                        # the first write about 8 s in:
    .sink("jsonl", path="/dev/full"))                                      # ENOSPC fails it while Spark runs
"""
ENDLESS = """
from pescheduler import Application
app = Application("spark-cleanup")
app.source("generator", events=None, keys=10, rate=2_000).sink("discard")
"""
EXIT_WITHIN_S = 150        # the stop includes stopping JVMs by PID (TERM, bounded wait, KILL)
TOTAL_S = 270              # the run and the exit together, inside pytest's 300 s: the test's own failure
                           # (with the deploy's stderr) and its clean-up of what was left, not pytest's timeout


def tagged(tmp: str) -> list[psutil.Process]:
    """Processes whose environment carries this test's TMPDIR (every one the deployment started)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TMPDIR") == tmp and proc.pid != os.getpid():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def ctrl_c_heard() -> None:
    """In the deploy's child before its exec: SIGINT at its default. A suite started as a background
    job of a non-interactive shell inherits SIGINT ignored, and Python then installs no Ctrl-C
    handler: the deploy would never hear this test's Ctrl-C (found in session 22, by py-spy)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def jvms(procs: list[psutil.Process]) -> list[psutil.Process]:
    def is_java(p):
        try:
            return "java" in os.path.basename(p.exe() or "") or "java" in " ".join(p.cmdline()[:1])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
    return [p for p in procs if is_java(p)]


@pytest.mark.parametrize("ending, app, signum, codes", [
    ("normal end", FINITE, None, (0,)),
    ("failure", FAILING, None, (1,)),
    ("ctrl-c", ENDLESS, signal.SIGINT, (130,)),
    ("sigterm", ENDLESS, signal.SIGTERM, (143,)),
])
def test_every_jvm_started_for_rm_spark_is_stopped(tmp_path, ending, app, signum, codes):
    tmp = str(tmp_path / "tmp")
    os.makedirs(tmp)
    (tmp_path / "app.py").write_text(app)
    env = {**os.environ, "TMPDIR": tmp, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    deploy = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                               "--rm", "spark", "--workers", "1", "--policy", "none", "--json"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=ctrl_c_heard)
    seen_jvms = 0
    lines: list[str] = []
    running = threading.Event()         # deploy() returned: Ctrl-C stops at once (before, it waits for this: cli.py)

    def read_stderr():
        for line in deploy.stderr:
            lines.append(line)
            if line.startswith("running on "):
                running.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + EXIT_WITHIN_S
        while deploy.poll() is None and time.monotonic() < deadline:
            seen_jvms = max(seen_jvms, len(jvms(tagged(tmp))))
            if signum is not None and seen_jvms >= 1 and running.is_set():
                deploy.send_signal(signum)            # while Spark is still starting
                signum = None
            time.sleep(0.2)                           # sampling another process tree: nothing to await
        try:
            code = deploy.wait(timeout=max(1.0, deadline - EXIT_WITHIN_S + TOTAL_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = f"none: still running after {TOTAL_S} s"
        reader.join(timeout=10)
        stderr = "".join(lines)
    finally:
        reap(deploy)                                 # by the PID this test started
        _gone, alive = psutil.wait_procs(tagged(tmp), timeout=10)
        left = []
        for proc in alive:                           # what it left, found by this test's TMPDIR: asserted
            with contextlib.suppress(psutil.NoSuchProcess):      # below, and never left to the machine
                left.append((proc.pid, proc.cmdline()[:3]))
                proc.kill()
    assert seen_jvms >= 1, f"{ending}: no JVM was ever started, so the test proves nothing\n{stderr}"
    assert code in codes, f"{ending}: exit {code}\n{stderr[-3000:]}"
    assert left == [], f"{ending}: left running: {left}"
