"""A lab whose process is SIGKILLed leaves its pieces; the next lab to start removes them.

``atexit`` cannot run in a killed process, so lab_net keeps a ledger per
process of what it owns; ``LabNetwork.create`` removes what dead processes'
ledgers name (``lab_net.remove_stale``). Real namespaces, bridge, cgroup and
a real process in it: this needs root, like every lab test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pescheduler.resource_managers import lab_net
from tests.waiting import gone

pytestmark = pytest.mark.lab

CHILD = """
import json, signal, subprocess, sys
from pescheduler.resource_managers import lab_net
net = lab_net.LabNetwork("10.213.0.0/16").create()
ns = lab_net.Namespace(net, 1, net.next_address()).create()
group = lab_net.CpuGroup(f"{net.name}-h1-test", 0.5).create()
worker = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
group.add(worker.pid)
print(json.dumps({"bridge": net.name, "netns": ns.name, "cgroup": group.dirs, "worker": worker.pid}), flush=True)
signal.pause()                       # until the test kills it
"""


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_what_a_killed_lab_process_made_is_removed_by_the_next_lab_and_a_live_ones_is_not():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    made = None
    try:
        made = json.loads(child.stdout.readline())
        live = [n for n in os.listdir(lab_net.LEDGER_DIR) if n.startswith(f"{child.pid}-")]
        assert len(live) == 1, "the child keeps a ledger of what it owns"
        assert made["netns"] not in lab_net.remove_stale(), "a live process's pieces are its own"
        assert made["netns"] in _namespaces() and os.path.isdir(made["cgroup"][0])
        child.send_signal(signal.SIGKILL)            # no atexit: everything it made stays
        child.wait(30)
        assert made["netns"] in _namespaces() and f" {made['bridge']}:" in _links()

        removed = lab_net.remove_stale()

        assert f"namespace {made['netns']}" in removed and f"bridge {made['bridge']}" in removed
        assert made["netns"] not in _namespaces()
        assert f" {made['bridge']}:" not in _links()
        assert not any(os.path.isdir(d) for d in made["cgroup"])
        gone([made["worker"]], timeout=30, what="the lab host's process, killed with its cgroup")
        assert not [n for n in os.listdir(lab_net.LEDGER_DIR) if n.startswith(f"{child.pid}-")]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        lab_net.remove_stale()                       # a failed check leaves nothing either


def test_a_live_processs_ledger_stays_its_own_across_a_step_of_the_wall_clock(monkeypatch):
    """A ledger is named after its process's PID and start; the wall clock stepped by 5 s moves
    psutil's ``create_time`` (the start since boot plus the boot time in wall-clock seconds), and
    by it a live process's ledger looked dead: ``remove_stale`` would remove what it still uses.
    Named by ``pescheduler.process_start`` it is still alive, and its path is still the same."""
    import psutil

    path = lab_net._ledger_path()
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 5.0)
    assert lab_net._alive(os.path.basename(path))
    assert lab_net._ledger_path() == path
