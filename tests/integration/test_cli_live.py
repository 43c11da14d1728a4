"""`status` and `stop` from another process against a running `deploy`, as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import re
from pathlib import Path

import jsonschema
import pytest
from distributed import LocalCluster

from waiting import reap, until

pytestmark = pytest.mark.integration
STATUS_SCHEMA = json.loads(re.search(r"```json\n(.*?)```", (Path(__file__).parents[2] / "docs" / "status.md")
                                     .read_text(), re.S).group(1))

APP = """
from pescheduler import Application

app = Application("live-cli")
(app.source("generator", events=None, keys=50, rate=20_000)
    .key_by("car").window(size="1s", aggregates={{"n": ("count", "speed")}})
    .sink("jsonl", path={out!r}))
"""


def cli(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "pescheduler", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_status_and_stop_reach_a_running_deployment(tmp_path):
    out = tmp_path / "counts.jsonl"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    deploy = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                               "--workers", "2", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120            # the deploying process publishes once it runs
        while True:
            status = cli("status", "--json", env=env)
            if status.returncode == 0 and json.loads(status.stdout)["state"] == "running":
                break
            assert deploy.poll() is None, deploy.stderr.read()
            assert time.monotonic() < deadline, status.stderr
            time.sleep(0.2)                          # another process: nothing to await but its file
        shown = json.loads(status.stdout)
        jsonschema.validate(shown, STATUS_SCHEMA)       # docs/status.md is what a script gets
        assert shown["app"] == "live-cli"
        assert [pe["operators"] for pe in shown["pes"]] == [["generator-1"], ["key_by-2", "window-3", "jsonl-4"]]
        # The embedded cluster closes with the deployment: stop says so once its client lost the
        # scheduler, not after waiting out the client's reconnect (connect-timeout, made long here).
        stop = cli("stop", env={**env, "PESCHEDULER__CLUSTER__CONNECT_TIMEOUT": "300s"}, timeout=60)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "stopped" in stop.stdout and "ERROR" not in stop.stderr, stop.stdout + stop.stderr
        # communicate, not wait: --json prints a status line per monitor interval into the pipe, and
        # on a loaded machine (slow to reach "running") they filled it before the stop: the deploying
        # process blocked in print and never exited (reproduced at load 15, faulthandler in _follow)
        _, stderr = deploy.communicate(timeout=120)
        assert deploy.returncode == 0, stderr
    finally:
        reap(deploy)                                 # by the PID this test started
    counts = [json.loads(line)["n"] for line in out.read_text().splitlines()]
    assert counts and sum(counts) > 0                # stop drained: the open windows fired
    assert not list((tmp_path / "state").iterdir())   # the deployment removed its record


def test_a_running_name_and_a_written_path_are_refused_naming_the_running_one(tmp_path):
    """Issue 36: the same deploy twice hid the first from `list`/`stop` and both truncated one file."""
    out = tmp_path / "counts.jsonl"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    first = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                              "--workers", "2", "--name", "cars"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        until(lambda: first.poll() is not None or (tmp_path / "state" / "cars.json").exists(), 120,
              "the first deployment to record itself")
        assert first.poll() is None, first.stderr.read()
        again = cli("deploy", str(tmp_path / "app.py"), "--workers", "2", "--name", "cars", env=env)
        assert again.returncode == 2, again.stdout + again.stderr
        assert "a deployment named 'cars' is already running on this machine" in again.stderr
        assert "running on" not in again.stdout           # refused before anything started
        other = cli("deploy", str(tmp_path / "app.py"), "--workers", "2", "--name", "other", env=env)
        assert other.returncode == 2, other.stdout + other.stderr
        assert f"'other' would write {out}, which the running deployment 'cars' of app 'live-cli'" \
            in other.stderr.replace("\n", " "), other.stderr
        listed = cli("list", env=env)
        assert [line.split()[1] for line in listed.stdout.splitlines() if "live-cli" in line] == ["cars"]
        stop = cli("stop", "cars", env=env, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        _, stderr = first.communicate(timeout=120)
        assert first.returncode == 0, stderr
    finally:
        reap(first)
    assert out.read_text()                     # the first one's output, untouched by the refused ones


@pytest.mark.parametrize("names", [("cars", "cars"), ("cars", "trucks")], ids=["same-name", "same-path"])
def test_two_deploys_started_at_once_one_runs_and_the_other_exits_2_naming_it(tmp_path, names):
    """Both checked the running ones before either had recorded itself (the record is written once
    the cluster is up, seconds later), so both ran: the claim is now taken, under a lock, first."""
    _race(tmp_path, names, "a deployment named 'cars' is already running on this machine")
    assert not list((tmp_path / "state").iterdir())   # record and claim removed by their writer


def test_two_deploys_on_one_cluster_started_at_once_one_runs_and_the_other_exits_2(tmp_path):
    """On a given cluster the published statuses are compared: both were read before either published."""
    with LocalCluster(n_workers=1, threads_per_worker=2, protocol="tcp", host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        address = cluster.scheduler_address
        _race(tmp_path, ("cars", "cars"), f"a deployment named 'cars' is already running on {address}",
              "--cluster", address)


def _race(tmp_path, names, same_name, *args):
    """Start ``deploy --name N`` for both ``names`` at once: exactly one runs (then stopped by its
    name), the other exits 2 naming it before it starts anything."""
    out = tmp_path / "counts.jsonl"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    logs = [tmp_path / f"deploy-{i}.out" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                               "--name", name, *(args or ("--workers", "2"))], stdout=log.open("w"),
                              stderr=subprocess.PIPE, text=True, env=env) for name, log in zip(names, logs)]
    try:
        until(lambda: any(p.poll() is not None for p in procs) or all("running on" in log.read_text()
                                                                     for log in logs),
              180, "one deploy to be refused, or both to run")
        assert [p.poll() is None for p in procs].count(True) == 1, [log.read_text() for log in logs]
        (loser, lost), (winner, won) = sorted(zip(procs, names), key=lambda pair: pair[0].poll() is None)
        stderr = loser.stderr.read().replace("\n", " ")
        assert loser.returncode == 2, stderr
        clash = same_name if lost == won else f"{lost!r} would write {out}, which the running deployment {won!r}"
        assert clash in stderr, stderr
        assert "running on" not in logs[procs.index(loser)].read_text()     # refused before a worker started
        stop = cli("stop", won, *args[:2], env=env, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        _, stderr = winner.communicate(timeout=120)
        assert winner.returncode == 0, stderr
    finally:
        for proc in procs:
            reap(proc)


def _deploy(app_file, *args, env):
    return subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(app_file), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _apps(tmp_path, n):
    """``n`` app files of the same app, each writing its own output: (app file, output) pairs."""
    made = []
    for i in range(n):
        out = tmp_path / f"counts-{i}.jsonl"
        (tmp_path / f"app-{i}.py").write_text(APP.format(out=str(out)))
        made.append((tmp_path / f"app-{i}.py", out))
    return made


def test_deploy_suffix_runs_beside_the_running_name_as_name_2(tmp_path):
    """Issue 36: `--suffix` deploys as NAME-2 where a second deploy of a running name exits 2."""
    (first_app, _), (second_app, second_out) = _apps(tmp_path, 2)
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    first = _deploy(first_app, "--workers", "1", "--name", "cars", env=env)
    second = None
    try:
        until(lambda: first.poll() is not None or (tmp_path / "state" / "cars.json").exists(), 120,
              "the first deployment to record itself")
        second = _deploy(second_app, "--workers", "1", "--name", "cars", "--suffix", "--duration", "3", env=env)
        stdout, stderr = second.communicate(timeout=180)
        assert second.returncode == 0, stdout + stderr
        assert "`python -m pescheduler status cars-2`" in stdout.replace("\n", " "), stdout
        assert second_out.read_text()                  # it ran, beside the first
        assert first.poll() is None                    # which still runs
        assert cli("stop", "cars", env=env, timeout=120).returncode == 0
        first.communicate(timeout=120)
    finally:
        reap(first)
        if second is not None:
            reap(second)


def test_deploy_replace_stops_the_running_name_then_deploys(tmp_path):
    """Issue 36: `--replace` stops the running deployment of that name (drained: its output is
    complete) and then deploys under the name."""
    (first_app, first_out), (second_app, second_out) = _apps(tmp_path, 2)
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    first = _deploy(first_app, "--workers", "1", "--name", "cars", env=env)
    try:
        until(lambda: first.poll() is not None or (tmp_path / "state" / "cars.json").exists(), 120,
              "the first deployment to record itself")
        again = cli("deploy", str(second_app), "--workers", "1", "--name", "cars", "--replace",
                    "--duration", "3", env=env, timeout=240)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "--replace: stopping the running 'cars' first" in again.stdout
        first.communicate(timeout=120)
        assert first.returncode == 0                   # stopped cleanly, drained
        assert first_out.read_text() and second_out.read_text()
    finally:
        reap(first)
    assert not list((tmp_path / "state").iterdir())


def test_suffix_and_replace_on_a_cluster(tmp_path):
    """On a --cluster the published statuses hold the names: --suffix finds cars-2 free there, and
    --replace stops the running cars through the scheduler before deploying."""
    (first_app, first_out), (second_app, second_out), (third_app, third_out) = _apps(tmp_path, 3)
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    with LocalCluster(n_workers=1, threads_per_worker=2, protocol="tcp", host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        address = cluster.scheduler_address
        first = _deploy(first_app, "--cluster", address, "--name", "cars", env=env)
        try:
            until(lambda: first.poll() is not None or cli("status", "cars", "--cluster", address,
                                                          env=env).returncode == 0, 120, "cars to publish")
            beside = cli("deploy", str(second_app), "--cluster", address, "--name", "cars", "--suffix",
                         "--duration", "3", env=env, timeout=240)
            assert beside.returncode == 0, beside.stdout + beside.stderr
            assert "status cars-2`" in beside.stdout.replace("\n", " ") and second_out.read_text()
            assert first.poll() is None
            again = cli("deploy", str(third_app), "--cluster", address, "--name", "cars", "--replace",
                        "--duration", "3", env=env, timeout=240)
            assert again.returncode == 0, again.stdout + again.stderr
            assert "--replace: stopping the running 'cars' first" in again.stdout
            first.communicate(timeout=120)
            assert first.returncode == 0 and first_out.read_text() and third_out.read_text()
        finally:
            reap(first)


FAILING_APP = """
from pescheduler import Application

def speed_kmh(e):
    return {{**e, "kmh": 3600 / (int(e["car"][4:]) % 25)}}      # car-0, car-25: ZeroDivisionError

app = Application("failing")
(app.source("generator", events=None, keys=50, rate=5_000)
    .map(speed_kmh)
    .sink("jsonl", path={out!r}))
"""


def test_the_first_exception_per_operator_is_in_status(tmp_path):
    """Issue 36: "dead letters 4772" and nowhere the exception."""
    app = tmp_path / "app.py"
    app.write_text(FAILING_APP.format(out=str(tmp_path / "out.jsonl")))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    deploy = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(app), "--workers", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        shown = {}

        def errors_published():
            status = cli("status", "--json", env=env)
            shown.update(json.loads(status.stdout) if status.returncode == 0 else {})
            assert deploy.poll() is None, deploy.stderr.read()
            return shown.get("errors") and len(shown.get("recent_dead_letters") or ()) >= 3
        until(errors_published, 120, "the deployment to publish its first error")
        jsonschema.validate(shown, STATUS_SCHEMA)
        assert len(shown["errors"]) == 1, shown["errors"]
        first = shown["errors"][0]
        assert (first["op"], first["type"], first["message"]) == ("map-2", "ZeroDivisionError", "division by zero")
        assert first["where"] == f"{app}:5" and first["count"] >= 1
        assert int(eval(first["sample"])["car"][4:]) % 25 == 0
        text = cli("status", "failing", "--dead-letters", "3", env=env)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert max(map(len, lines)) <= 80, text.stdout          # fits 80 columns off a terminal
        assert "first error per operator" in text.stdout and "ZeroDivisionError" in text.stdout
        assert "newest 3 dead letters of failing" in text.stdout
        assert text.stdout.count("map-2: ZeroDivisionError: division by zero\n") == 3
        assert text.stdout.replace("\n", "").count(f"  at {app}:5") == 3
        assert cli("stop", env=env, timeout=120).returncode == 0
        deploy.communicate(timeout=120)
    finally:
        reap(deploy)


def test_ctrl_c_while_the_cluster_starts_stops_cleanly_once_it_is_up(tmp_path):
    """Issue 36: Ctrl-C while the embedded cluster spawned was dropped silently."""
    out = tmp_path / "counts.jsonl"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    deploy = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                               "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = deploy.stdout.readline()             # said before the cluster starts (seconds, more under load)
        assert first.startswith("deploying live-cli"), first + deploy.stderr.read()
        deploy.send_signal(signal.SIGINT)
        stdout, stderr = deploy.communicate(timeout=180)
    finally:
        reap(deploy)
    assert deploy.returncode == 130, stdout + stderr
    assert "Ctrl-C: stopping once the cluster is up" in stderr
    assert "running on" in stdout and "interrupted: draining sources" in stderr     # up, then stopped
    assert not list((tmp_path / "state").iterdir())  # the clean stop removed the record


def test_a_killed_deploying_process_does_not_hold_its_name_on_the_cluster(tmp_path):
    """The deploying process of a `--cluster` deployment is SIGKILLed: its published status stayed
    `running` for good, so `list` showed a ghost and every later deploy of that name (a driver's
    restart, `--restore latest`) was refused as already running. A status whose publishing client
    has left the scheduler is `lost`: listed so, never running, and its name free again."""
    out = tmp_path / "counts.jsonl"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    with LocalCluster(n_workers=1, threads_per_worker=2, protocol="tcp", host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        address = cluster.scheduler_address
        log = tmp_path / "first.out"
        first = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                                  "--name", "cars", "--cluster", address], stdout=log.open("w"),
                                 stderr=subprocess.DEVNULL, env=env)
        second = None
        try:
            until(lambda: first.poll() is not None or "running on" in log.read_text(), 180,
                  "the first deployment to run")
            assert first.poll() is None, log.read_text()
            first.send_signal(signal.SIGKILL)
            first.wait(60)
            listed = cli("list", "--cluster", address, env=env)
            assert listed.returncode == 0, listed.stderr
            row = [line for line in listed.stdout.splitlines() if " cars " in f" {line} "]
            assert row and "lost" in row[0] and "running" not in row[0], listed.stdout
            log2 = tmp_path / "second.out"
            second = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                                       "--name", "cars", "--cluster", address], stdout=log2.open("w"),
                                      stderr=subprocess.PIPE, text=True, env=env)
            until(lambda: second.poll() is not None or "running on" in log2.read_text(), 180,
                  "the second deployment to run or be refused")
            assert second.poll() is None, second.stderr.read()
            stop = cli("stop", "cars", "--cluster", address, env=env, timeout=120)
            assert stop.returncode == 0, stop.stdout + stop.stderr
            _, stderr = second.communicate(timeout=120)
            assert second.returncode == 0, stderr
        finally:
            reap(first)
            if second is not None:
                reap(second)
