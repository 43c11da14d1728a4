"""The example policy package (examples/policies), pip-installed as a user would, found and run.

It is installed into a private directory (not the test environment); its
entry point makes ``latency-guard`` a policy that ``plugins`` lists, its own
tests pass against the installed copy, and ``deploy --policy latency-guard``
runs it on a real deployment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).parent.parent.parent / "examples" / "policies"
WAIT = 300

APP = '''
import time
from pescheduler import Application

def spin(e):
    end = time.perf_counter() + 0.0006          # 9.6 s for the 16,000: the unbounded source's queue builds
    while time.perf_counter() < end:            # (at 2,000 events/s, 1.2 cores, a loaded suite's guard
        pass                                    # logged no decision at all: session 79)
    return {{**e, "v": e["n"] + 1}}

app = Application("guarded")
(app.source("iterable", items=[{{"n": n, "ts": n}} for n in range(16_000)])
    .map(spin, id="slow").sink("jsonl", path={out!r}))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(PACKAGE)], check=True, timeout=WAIT, cwd=build)
    return target


def run(args, installed, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=WAIT, **kw)


def test_plugins_lists_the_installed_policy(installed, tmp_path):
    result = run(["-m", "pescheduler", "plugins"], installed, tmp_path)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "latency-guard" in line)
    assert "pescheduler-latency-guard 0.1.0" in row


def test_the_packages_own_tests_pass_against_the_installed_copy(installed, tmp_path):
    # -n 0: the package has no pytest settings of its own, so this repository's apply (its addopts
    # would start three xdist workers for the package's one test)
    result = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", str(PACKAGE / "tests")], installed,
                 tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout


def test_deploy_policy_latency_guard_copies_the_queued_operator(installed, tmp_path):
    out, log = tmp_path / "out.jsonl", tmp_path / "decisions.jsonl"
    (tmp_path / "app.py").write_text(APP.format(out=str(out)))
    # its settings under the entry-point name, declared by its pescheduler_policy_defaults
    (tmp_path / "conf.yaml").write_text(f"policies:\n  decision-log: {log}\n  latency-guard:\n    max-copies: 1\n")
    result = run(["-m", "pescheduler", "deploy", "app.py", "--workers", "3", "--policy", "latency-guard",
                  "--config", "conf.yaml"], installed, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(json.loads(line)["v"] for line in out.read_text().splitlines()) == list(range(1, 16_001))
    # No decision at all in two loaded suites (session 79): the run's own account says why
    assert log.exists(), "no decision logged:\n" + result.stdout[-4000:] + result.stderr[-4000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    # host events and copy activations share the log; they carry no policy
    assert {d["kind"] for d in lines if d["policy"] is None} <= {"host", "activation"}, lines
    decisions = [d for d in lines if d["policy"] is not None]
    assert {d["policy"] for d in decisions} == {"latency-guard"}
    asked = [d for d in decisions if d["action"] == "Replicate('slow', 1)"]
    assert asked and "longest input queue" in asked[0]["reason"], decisions
    # applied; refused on a loaded machine (no host with CPU to spare); held by the cooldown that
    # follows a Release of the copy, when the queue builds up again; or cancelled by the stream's end
    # (two loaded suites logged nothing at all, sessions 79 and 80: the Replicate waited for the
    # reconfiguration lock, which Dask's dashboard import held whole, 12-14 s at load 11-14; now a
    # step of it, session 81)
    assert all(d["outcome"] == "applied" or "has no more CPU" in d["detail"] or d["detail"].startswith("cooldown")
               or (d["outcome"] == "cancelled" and d["detail"] == "the deployment ended before it was applied")
               for d in asked), json.dumps(asked, indent=1)
    copies = 0
    for d in decisions:
        if d["outcome"] == "applied" and d["target"] == "slow":
            copies = copies + 1 if d["kind"] == "Replicate" else 0 if d["kind"] == "Release" else copies
            assert copies <= 1, "max-copies: 1 (set in conf.yaml) was not honoured: " + json.dumps(decisions)


def test_a_misspelt_setting_of_the_installed_policy_names_the_closest(installed, tmp_path):
    (tmp_path / "app.py").write_text(APP.format(out=str(tmp_path / "out.jsonl")))
    (tmp_path / "conf.yaml").write_text("policies:\n  latency-guard:\n    max-copys: 1\n")
    result = run(["-m", "pescheduler", "deploy", "app.py", "--policy", "latency-guard", "--config", "conf.yaml"],
                 installed, tmp_path)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "policies.latency-guard.max-copys: unknown key; did you mean policies.latency-guard.max-copies?" \
        in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
