"""The command line: plugins, status/stop without a deployment, deploy's exits and output.

``deploy`` is driven in-process against a fake :class:`Deployment` (the
contract: status, wait, stop, scheduler_address), so its control flow is
tested without a cluster; the other commands run as a user types them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import dask.config
import pytest

import pescheduler.control.deployment
from pescheduler import cli
from pescheduler.errors import DeploymentFailed, InvalidApplication

APP = """\
from pescheduler import Application

app = Application("fake")
app.source("iterable", items=[1, 2, 3]).sink("print")
"""


def run(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "pescheduler", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=120)


def no_state_file(tmp_path) -> dict:
    return {"DASK_PESCHEDULER__STATE_DIR": str(tmp_path / "state")}


# -- plugins -------------------------------------------------------------------------------

def test_plugins_lists_the_builtin_generator_with_its_origin(tmp_path):
    result = run("plugins", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if " generator " in line]
    assert rows, result.stdout
    assert "source" in rows[0] and "builtin-operators" in rows[0]
    origin = [line for line in result.stdout.splitlines() if " builtin-operators " in line][-1]
    assert "pescheduler 0.1.0" in origin            # the plug-ins table: each plug-in's origin once


def test_a_plugin_that_fails_is_shown_and_the_rest_still_listed(tmp_path):
    result = run("plugins", "--plugin", "does.not.exist", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "failed to load" in result.stdout
    failure = [line for line in result.stdout.splitlines() if "does.not.exist" in line]
    assert failure and "ModuleNotFoundError: No module" in failure[0]     # the rest folds: 80 columns
    assert "named 'does'" in result.stdout
    assert " generator " in result.stdout and " window " in result.stdout


# -- status / stop ---------------------------------------------------------------------------

def test_status_without_a_deployment_says_so_and_exits_1(tmp_path):
    result = run("status", cwd=tmp_path, env=no_state_file(tmp_path))
    assert result.returncode == 1
    assert "no deployment found" in result.stderr and "python -m pescheduler deploy" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_with_a_stale_state_file_exits_1(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state = tmp_path / "state" / "old.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"name": "old", "scheduler": "tcp://127.0.0.1:1", "app": "old", "pid": gone.pid}))
    result = run("status", cwd=tmp_path, env=no_state_file(tmp_path))
    assert result.returncode == 1 and "no deployment found" in result.stderr
    named = run("status", "old", cwd=tmp_path, env=no_state_file(tmp_path))
    assert named.returncode == 1 and "no deployment named 'old' runs embedded on this machine" in named.stderr
    assert "`--cluster ADDR`" in named.stderr       # where one deployed on a cluster is found (issue 36)


def test_stop_without_a_deployment_exits_1(tmp_path, capsys):
    with dask.config.set({"pescheduler.state-dir": str(tmp_path / "none")}):
        assert cli.main(["stop"]) == 1
    err = capsys.readouterr().err
    assert "no deployment found" in err and "`--cluster ADDR`" in err


def test_no_command_prints_usage_and_exits_2(tmp_path):
    result = run(cwd=tmp_path)
    assert result.returncode == 2 and "usage: pescheduler" in result.stderr


# -- deploy: user mistakes exit 2 without a traceback ---------------------------------------------

def test_broken_app_exits_2_with_file_and_line(tmp_path):
    (tmp_path / "app.py").write_text("from pescheduler import Application\napp = Application(\n")
    result = run("deploy", "app.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "app.py:2" in result.stderr and "SyntaxError" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_a_state_dir_the_workers_cannot_use_exits_2_before_any_worker_starts(tmp_path):
    """``--state disk`` on the embedded cluster with ``pescheduler.state.dir`` a file: refused naming
    the key, before the cluster starts (before, each PE failed at its first store, after the start,
    with a traceback ending in NotADirectoryError)."""
    (tmp_path / "app.py").write_text(APP.replace('"iterable", items=[1, 2, 3]).sink("print")',
                                                 '"iterable", items=[{"k": 1}]).key_by("k").latest().sink("print")'))
    (tmp_path / "a-file").write_text("")
    result = run("deploy", "app.py", "--state", "disk", cwd=tmp_path,
                 env={**no_state_file(tmp_path), "PESCHEDULER__STATE__DIR": str(tmp_path / "a-file")})
    assert result.returncode == 2, result.stderr
    assert "pescheduler.state.dir" in result.stderr and "NotADirectoryError" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "distributed" not in result.stderr and "embedded" not in result.stderr, result.stderr  # no worker started


def test_missing_config_file_exits_2(tmp_path, capsys):
    (tmp_path / "app.py").write_text(APP)
    assert cli.main(["deploy", str(tmp_path / "app.py"), "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "--config" in capsys.readouterr().err


# -- deploy against a fake deployment ---------------------------------------------------------------

def status(state: str, **extra) -> dict:
    return {"app": "fake", "state": state, "elapsed_s": 1.5, "error": None, "dead_letters": 0,
            "late_events": 0, "pes": [{"pe": "iterable-1->print-2", "tuples_in_per_s": 10.0,
                                       "tuples_out_per_s": 10.0, "busy": 0.1, "backpressure": 0.0}],
            "events": [{"t": 0.5, "kind": "deploy", "text": "1 PEs on 1 workers"}], **extra}


class FakeDeployment:
    """Plays back ``outcomes`` from ``wait``: "timeout", a final status, or an exception."""

    scheduler_address = "tcp://127.0.0.1:8786"

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.stops = 0

    def status(self):
        return status("running")

    def wait(self, timeout=None):
        outcome = self.outcomes.pop(0) if self.outcomes else "timeout"
        if outcome == "timeout":
            raise TimeoutError
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def stop(self):
        self.stops += 1
        return status("stopped")


@pytest.fixture
def app_file(tmp_path):
    path = tmp_path / "app.py"
    path.write_text(APP)
    return str(path)


@pytest.fixture
def fake_deploy(monkeypatch):
    """Replace deploy(); returns the calls (kwargs, plus what SIGINT was set to during the call)."""
    calls = []

    def install(outcomes=(), error=None):
        dep = FakeDeployment(outcomes)

        def deploy(app, **kwargs):
            calls.append({**kwargs, "app": app, "sigint": signal.getsignal(signal.SIGINT)})
            if error is not None:
                raise error
            return dep
        monkeypatch.setattr(pescheduler.control.deployment, "deploy", deploy)
        monkeypatch.setattr(cli, "_reachable", lambda address: None)     # the fake's cluster "answers"
        return dep
    install.calls = calls
    return install


def test_finished_app_logs_lines_and_exits_0(app_file, fake_deploy, capsys):
    dep = fake_deploy(["timeout", "timeout", status("finished")])
    assert cli.main(["deploy", app_file, "--cluster", "tcp://127.0.0.1:8786"]) == 0
    out = capsys.readouterr().out
    assert out.count("fake running | iterable-1->print-2: in 10/s") == 2
    assert "event deploy: 1 PEs on 1 workers" in out and out.count("event deploy") == 1
    assert "fake finished |" in out and "fake finished after 1.5 s" in out
    assert dep.stops == 1
    assert fake_deploy.calls[0]["cluster"] == "tcp://127.0.0.1:8786"
    assert fake_deploy.calls[0]["app"].name == "fake"


def test_json_prints_one_status_per_line(app_file, fake_deploy, capsys):
    fake_deploy(["timeout", status("finished")])
    assert cli.main(["deploy", app_file, "--json", "--cluster", "tcp://x:1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["state"] for s in lines] == ["running", "finished"]


def test_failure_prints_the_reason_and_exits_1(app_file, fake_deploy, capsys):
    dep = fake_deploy([DeploymentFailed("lost worker tcp://w1")])
    assert cli.main(["deploy", app_file, "--cluster", "tcp://x:1"]) == 1
    assert "fake failed: lost worker tcp://w1" in capsys.readouterr().err
    assert dep.stops == 1


def test_ctrl_c_stops_and_exits_130(app_file, fake_deploy, capsys):
    dep = fake_deploy(["timeout", KeyboardInterrupt()])
    assert cli.main(["deploy", app_file, "--cluster", "tcp://x:1"]) == 130
    assert dep.stops == 1
    assert "interrupted" in capsys.readouterr().err


def test_duration_stops_the_deployment_and_exits_0(app_file, fake_deploy, capsys):
    dep = fake_deploy()                 # never ends by itself
    assert cli.main(["deploy", app_file, "--duration", "1e-9", "--cluster", "tcp://x:1"]) == 0
    assert dep.stops >= 1
    assert "fake stopped after" in capsys.readouterr().out


def test_invalid_application_at_deploy_exits_2(app_file, fake_deploy, capsys):
    fake_deploy(error=InvalidApplication("print-2: unknown sink 'prnt'. Known sinks: jsonl, print"))
    assert cli.main(["deploy", app_file, "--cluster", "tcp://x:1"]) == 2
    assert "unknown sink 'prnt'" in capsys.readouterr().err


def test_rm_and_policies_are_passed_only_when_given(app_file, fake_deploy):
    fake_deploy([status("finished")] * 3)
    cli.main(["deploy", app_file, "--workers", "2"])
    cli.main(["deploy", app_file, "--rm", "local", "--policy", "threshold", "--policy", "rate"])
    cli.main(["deploy", app_file, "--policy", "none"])
    plain, chosen, none = fake_deploy.calls
    assert "rm" not in plain and "policies" not in plain and plain["workers"] == 2
    assert chosen["rm"] == "local" and chosen["policies"] == ["threshold", "rate"]
    assert none["policies"] == []


def test_checkpoint_flags_reach_deploy_only_when_given(app_file, fake_deploy):
    fake_deploy([status("finished")] * 3)
    cli.main(["deploy", app_file])
    cli.main(["deploy", app_file, "--checkpoint", "s3://b/ck", "--checkpoint-interval", "2s", "--restore", "latest"])
    cli.main(["deploy", app_file, "--checkpoint"])
    plain, given, default = fake_deploy.calls
    assert not {"checkpoint", "checkpoint_interval", "restore"} & set(plain)
    assert (given["checkpoint"], given["checkpoint_interval"], given["restore"]) == ("s3://b/ck", "2s", "latest")
    assert default["checkpoint"] is True and "restore" not in default


def test_ctrl_c_while_deploy_starts_is_acknowledged_then_a_clean_stop(app_file, monkeypatch, capsys):
    """Issue 36: Ctrl-C while the cluster spawned was dropped silently (SIGINT was ignored then)."""
    dep = FakeDeployment([status("finished")])

    def deploy(app, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)          # the user's Ctrl-C, half-way through the start
        return dep
    monkeypatch.setattr(pescheduler.control.deployment, "deploy", deploy)
    before = signal.getsignal(signal.SIGINT)
    assert cli.main(["deploy", app_file]) == 130
    err = capsys.readouterr().err
    assert "Ctrl-C: stopping once the cluster is up" in err and "interrupted: draining sources" in err
    assert dep.stops == 1 and dep.outcomes            # stopped at once, never followed (nothing waited)
    assert signal.getsignal(signal.SIGINT) is before


def test_options_this_version_refuses_exit_2(app_file, fake_deploy, capsys):
    fake_deploy(error=TypeError("deploy() got options this version does not support yet: policies"))
    assert cli.main(["deploy", app_file, "--policy", "threshold", "--cluster", "tcp://x:1"]) == 2
    assert "--policy: not available in this version" in capsys.readouterr().err


# -- mistakes found before anything starts: exit 2, no traceback, deploy never called --------------

@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_workers_below_one_is_a_usage_error(app_file, fake_deploy, capsys, value):
    fake_deploy()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["deploy", app_file, "--workers", value])
    assert exit_.value.code == 2 and "--workers" in capsys.readouterr().err
    assert fake_deploy.calls == []


def test_unknown_and_bad_config_keys_exit_2_naming_them(app_file, fake_deploy, capsys, tmp_path):
    fake_deploy()
    (tmp_path / "bad.yaml").write_text("channel:\n  credit: 3\nbatch:\n  size: -5\n")
    saved = __import__("copy").deepcopy(dask.config.config)
    try:
        assert cli.main(["deploy", app_file, "--config", str(tmp_path / "bad.yaml")]) == 2
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
    err = capsys.readouterr().err
    assert "channel.credit: unknown key; did you mean channel.credits?" in err
    assert "batch.size: -5 is not valid; expected an integer >= 1" in err
    assert fake_deploy.calls == []


def test_unknown_operator_is_reported_with_file_and_line_before_deploying(tmp_path, fake_deploy, capsys):
    fake_deploy()
    app = tmp_path / "typo.py"
    app.write_text('from pescheduler import Application\n\napp = Application("typo")\n'
                   'src = app.source("iterable", items=[])\nsrc.apply("mapp").sink("print")\n')
    assert cli.main(["deploy", str(app)]) == 2
    err = capsys.readouterr().err
    assert f"{app}:5: mapp-2: unknown operator 'mapp'" in err and "Known operators:" in err and " map," in err
    assert fake_deploy.calls == []


def test_a_plugin_that_fails_to_import_exits_2_naming_it(app_file, fake_deploy, capsys):
    fake_deploy()
    assert cli.main(["deploy", app_file, "--plugin", "no_such_plugin_module"]) == 2
    assert "--plugin no_such_plugin_module failed to load: ModuleNotFoundError" in capsys.readouterr().err
    assert fake_deploy.calls == []


@pytest.mark.parametrize("body, said", [
    ("def pescheduler_operators(extra):\n    return []\n", "extra"),                 # wrong signature
    ("def pescheduler_operatorz():\n    return []\n", "pescheduler_operatorz is not a pescheduler hook"),
])
def test_a_plugin_hook_that_does_not_match_exits_2_naming_it(app_file, fake_deploy, capsys, tmp_path,
                                                           monkeypatch, body, said):
    fake_deploy()
    name = f"bad_hook_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text("import pescheduler\n\n@pescheduler.hookimpl\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["deploy", app_file, "--plugin", name]) == 2
    err = capsys.readouterr().err
    assert f"--plugin {name} failed to load" in err and said in err
    assert fake_deploy.calls == []


def test_an_unreachable_cluster_fails_within_the_connect_timeout_naming_it(app_file, capsys):
    import time

    started = time.monotonic()
    assert cli.main(["deploy", app_file, "--cluster", "tcp://127.0.0.1:1"]) == 1
    took = time.monotonic() - started
    assert "cannot reach the cluster at tcp://127.0.0.1:1 within 5 s" in capsys.readouterr().err
    assert took < 5 + 3          # the timeout plus loading the app on a loaded machine


# -- named deployments -------------------------------------------------------------------------------

def _record(directory, name, pid):
    directory.mkdir(exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(
        {"name": name, "scheduler": f"tcp://127.0.0.1:{9000 + len(name)}", "app": "cars", "pid": pid,
         "started": 0}))


def test_status_and_stop_need_a_name_when_several_deployments_run(tmp_path):
    env = no_state_file(tmp_path)
    _record(tmp_path / "state", "alpha", os.getpid())          # this test process: alive
    _record(tmp_path / "state", "beta", os.getpid())
    for command in ("status", "stop"):
        result = run(command, cwd=tmp_path, env=env)
        assert result.returncode == 2, result.stderr
        assert "2 deployments are running: alpha, beta; name one" in result.stderr
    listed = run("list", cwd=tmp_path, env=env)
    assert listed.returncode == 0
    assert [line.split()[1] for line in listed.stdout.splitlines() if "tcp://" in line] == ["alpha", "beta"]


def test_the_state_file_is_per_name_and_removed_only_by_its_writer(tmp_path):
    from pescheduler.control import statefile

    with dask.config.set({"pescheduler.state-dir": str(tmp_path)}):
        statefile.use_name("nightly")
        statefile.write("tcp://127.0.0.1:1234", "cars")
        statefile.use_name(None)
        statefile.write("tcp://127.0.0.1:1235", "cars app")     # a second deployment, by app name
        assert [s["name"] for s in statefile.running()] == ["nightly", "cars_app"]
        assert statefile.read("nightly")["scheduler"] == "tcp://127.0.0.1:1234"
        statefile.remove()                                      # removes what this process wrote last
        assert (tmp_path / "nightly.json").exists() and not (tmp_path / "cars_app.json").exists()
    with pytest.raises(ValueError, match="--name"):
        statefile.use_name("../x")


def test_a_claim_is_seen_while_its_process_lives_and_removed_with_its_record(tmp_path):
    from pescheduler.control import statefile

    with dask.config.set({"pescheduler.state-dir": str(tmp_path)}):
        with statefile.locked():
            statefile.claim("nightly", "cars", ["/tmp/out.jsonl"])
        _record(tmp_path, "stale", 2 ** 22 + 1)                 # no such pid: a killed deployment's
        (tmp_path / "stale.claim").write_text((tmp_path / "stale.json").read_text())
        assert [(c["name"], c["outputs"]) for c in statefile.claims()] == [("nightly", ["/tmp/out.jsonl"])]
        statefile.write("tcp://127.0.0.1:1234", "cars", name="nightly")
        statefile.remove("nightly")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["stale.claim", "stale.json"]


def test_status_of_a_tls_scheduler_without_certificates_says_so_at_once(tmp_path, capsys):
    """Without TLS flags (or Dask TLS config) no connect to a tls:// scheduler can succeed: said at
    once, not after every attempt failed until connect-timeout (made long here)."""
    with dask.config.set({"pescheduler.cluster.connect-timeout": "300s"}):
        assert cli.main(["status", "--cluster", "tls://127.0.0.1:1"]) == 1
    assert "speaks TLS: give --tls-ca-file, --tls-cert and --tls-key" in capsys.readouterr().err


def test_a_deployment_still_starting_is_awaited_by_name_until_it_records_itself(tmp_path):
    """`stop cars` right after `deploy --name cars` (CI: the refused twin exited first) found no
    record, since it is written once the cluster is up, and said none runs: the claim shows it is
    starting, so the address is awaited (bounded) and found once the record appears."""
    import io
    import threading

    from rich.console import Console

    from pescheduler.control import statefile

    said = io.StringIO()
    with dask.config.set({"pescheduler.state-dir": str(tmp_path), "pescheduler.cluster.connect-timeout": "60s"}):
        with statefile.locked():
            statefile.claim("cars", "live-cli", [])
        waiting = threading.Event()

        def record_once_awaited():            # the deploying process, its cluster now up
            assert waiting.wait(60)
            statefile.write("tcp://127.0.0.1:1234", "live-cli", name="cars")

        writer = threading.Thread(target=record_once_awaited)
        writer.start()

        class Said(io.StringIO):
            def write(self, text):
                said.write(text)
                if "is starting" in said.getvalue():
                    waiting.set()
                return len(text)

        try:
            assert cli._scheduler_address(None, "cars", Console(file=Said())) == "tcp://127.0.0.1:1234"
        finally:
            waiting.set()
            writer.join(60)
            statefile.remove("cars")
    assert f"'cars' is starting (pid {os.getpid()})" in said.getvalue()


def test_a_name_nothing_claims_is_not_awaited(tmp_path, capsys):
    with dask.config.set({"pescheduler.state-dir": str(tmp_path), "pescheduler.cluster.connect-timeout": "300s"}):
        assert cli.main(["stop", "cars"]) == 1
    assert "no deployment named 'cars' runs embedded on this machine (running: none)" in capsys.readouterr().err
