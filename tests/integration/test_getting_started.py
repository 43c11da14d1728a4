"""docs/getting-started.md followed as a newcomer does: every command of its shell blocks, in order.

The files it asks for (``cars.py``, ``tuning.yaml``) are its own blocks, written
into a fresh folder; each line of its ``bash`` blocks is then run there, as
typed. A line ending in ``&``, and a ``deploy`` of the endless app (a terminal
of its own in the guide), runs in the background (``&`` lines one after the
other, as typed: the next other line waits until their scheduler answers and
their workers joined); ``kill %N`` ends the N-th
background job, as the shell would; every other line must exit 0 (``list`` and
``status`` are asked again until the deployment they name runs, as a person
would look again). Two things differ from a terminal, both forced by a shared
test machine: the guide's fixed ports (8786, 8787) are replaced by free ones,
and ``pip install -e .`` is not run (the suite runs in the installed checkout).

Beyond each line's exit status, what the guide promises is checked: the
dashboard link the deploy prints serves the ``/pescheduler`` page with the
app's PEs; the preloaded scheduler's dashboard serves it and the metrics; each
``stop`` ends its deployment with status 0; nothing the guide started is left.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from waiting import reap, until

ROOT = Path(__file__).parents[2]

DOC = ROOT / "docs" / "getting-started.md"
BLOCKS = re.findall(r"^```(\w*)[^\n]*\n(.*?)^```", DOC.read_text(), re.S | re.M)
BOUND = 180.0           # seconds: every wait here is bounded by this (three deployments on a loaded machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return r.read().decode()


def lines_of(language: str) -> list[str]:
    """Every command line of the guide's ``language`` blocks, in order, comments removed."""
    found = []
    for lang, code in BLOCKS:
        if lang == language:
            found += [line.split(" #", 1)[0].strip() for line in code.splitlines()]
    return [line for line in found if line and not line.startswith("#")]


def file_block(name: str) -> str:
    """The block the guide says to save as ``name`` (the first after the words "Save this as" / "Save as")."""
    text = DOC.read_text()
    at = text.index(f"`{name}`")
    return re.search(r"```\w*\n(.*?)```", text[at:], re.S).group(1)


class Terminal:
    """The shell a newcomer types into: runs lines, keeps background jobs, stops them by PID."""

    def __init__(self, folder: Path, ports: dict[str, str]) -> None:
        self.folder, self.ports = folder, ports
        self.env = {**os.environ, "PESCHEDULER__STATE_DIR": str(folder / "state")}
        self.jobs: list[tuple[list[str], subprocess.Popen, Path]] = []     # (argv, process, its log)
        self.shell_jobs: list[subprocess.Popen] = []       # the ``&`` ones: ``kill %N`` names them
        self.redirected: list[Path] = []                   # the files ``CMD > FILE 2>&1`` lines wrote

    def argv(self, line: str) -> list[str]:
        for old, new in self.ports.items():
            line = line.replace(old, new)
        argv = shlex.split(line)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "dask":       # this interpreter's dask (the one an activated venv puts first)
            argv[:1] = [sys.executable, "-m", "dask"]
        return argv

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=BOUND)

    def background(self, argv: list[str], ampersand: bool) -> subprocess.Popen:
        """Start ``argv`` without waiting: a ``&`` job of this shell, or a terminal of its own; its
        output goes where the line redirects it (``> FILE 2>&1``, as the shell does), else to a log."""
        argv, target = redirect(argv)
        log = self.folder / (target or f"job-{len(self.jobs) + 1}.log")
        self.redirected += [log] if target else []
        with open(log, "w") as out:                   # a file: a pipe nobody reads would fill and block
            proc = subprocess.Popen(argv, cwd=self.folder, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.jobs.append((argv, proc, log))
        if ampersand:
            self.shell_jobs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen) -> str:
        return next(log for _argv, p, log in self.jobs if p is proc).read_text()

    def close(self) -> None:
        """Whatever still runs (a failed test): its process group (a nanny's worker with it), by the
        PID this test started it under, then the process itself is collected."""
        for _argv, proc, _log in reversed(self.jobs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            reap(proc)


def redirect(argv: list[str]) -> tuple[list[str], str | None]:
    """``CMD > FILE 2>&1`` as the shell takes it: the command, and the file both its outputs go to."""
    if ">" not in argv:
        return argv, None
    at = argv.index(">")
    assert argv[at + 2:] == ["2>&1"], f"a redirection this terminal does not take: {shlex.join(argv)}"
    return argv[:at], argv[at + 1]


def deploys_forever(argv: list[str]) -> bool:
    return argv[1:4] == ["-m", "pescheduler", "deploy"] and "--duration" not in argv


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_every_file_the_readme_and_the_docs_name_exists():
    """A newcomer opens the files the pages point to (README's "where to look next" named two
    that had moved)."""
    path = re.compile(r"(?<![\w/.-])((?:pescheduler|examples|bench|tests|docs)/[\w/.-]*\.(?:py|md|yaml|png|toml))")
    pages = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {(page.relative_to(ROOT).as_posix(), p) for page in pages for p in path.findall(page.read_text())}
    assert len(named) > 20
    missing = sorted((page, p) for page, p in named if not (ROOT / p).exists())
    assert not missing, missing


@pytest.mark.integration
def test_the_guide_runs_as_written(tmp_path):
    (tmp_path / "cars.py").write_text(file_block("cars.py"))
    (tmp_path / "tuning.yaml").write_text(file_block("tuning.yaml"))
    ports = {"8786": str(free_port()), "8787": str(free_port())}
    shell = Terminal(tmp_path, ports)
    deploys: dict[str, subprocess.Popen] = {}       # --name, or the --cluster address -> its deploy
    lines = lines_of("bash")
    assert lines[0] == "pip install -e ." and any("--preload pescheduler.dashboard" in line for line in lines)
    ready: list = []            # checks of the ``&`` jobs started since the last line that was waited for
    try:
        for line in lines[1:]:
            argv = shell.argv(line.rstrip("&").strip())
            if not line.endswith("&"):
                # As at a prompt: ``&`` lines are typed one after the other (the workers retry until
                # their scheduler answers); the next line that needs them waits until they are up.
                for check in ready:
                    check()
                ready.clear()
            if argv[0] == "kill":
                for job in argv[1:]:
                    proc = shell.shell_jobs[int(job.lstrip("%")) - 1]
                    proc.terminate()
                    proc.wait(timeout=BOUND)
            elif line.endswith("&") or deploys_forever(argv):
                proc = shell.background(argv, ampersand=line.endswith("&"))
                if deploys_forever(argv):
                    key = option(argv, "--name") or option(argv, "--cluster")
                    deploys[key] = proc
                    watch_deploy(shell, proc, key, argv)
                elif "scheduler" in argv:
                    ready.append(lambda argv=argv, line=line: until(lambda: answers(argv), BOUND,
                                                                    f"the scheduler of `{line}`"))
                else:
                    n = len([a for a, _p, _l in shell.jobs if "worker" in a])
                    ready.append(lambda argv=argv, n=n: worker_joined(shell, argv, n))
            elif argv[3:4] == ["stop"]:
                key = option(argv, "--cluster") or argv[4]
                done = shell.run(argv)
                assert done.returncode == 0, f"`{line}`: {done.stdout}{done.stderr}"
                assert deploys[key].wait(timeout=BOUND) == 0, shell.log(deploys[key])
            else:
                done = shell.run(argv)
                assert done.returncode == 0, f"`{line}`: {done.stdout}{done.stderr}"
                if argv[3:4] == ["plugins"]:
                    assert "generator" in done.stdout
        for check in ready:
            check()
        assert deploys and all(proc.poll() == 0 for proc in deploys.values()), "a deployment was never stopped"
        assert all(proc.poll() is not None for _a, proc, _l in shell.jobs), "the guide left a process running"
        assert shell.run([sys.executable, "-m", "pescheduler", "list"]).returncode == 0
        assert not list((tmp_path / "state").glob("*.json")), "a deployment's record was left behind"
        # the cluster's logs went to the files the guide names, not over the live view of its deploy
        assert [p.name for p in shell.redirected] == ["scheduler.log", "worker-1.log", "worker-2.log"]
        assert "Scheduler at" in shell.redirected[0].read_text()
    finally:
        shell.close()


def watch_deploy(shell: Terminal, proc: subprocess.Popen, key: str, argv: list[str]) -> None:
    """Until the deployment runs, as the guide's reader would see it: by name (``status NAME``),
    or on the cluster's dashboard; then the page shows its PEs."""
    if key.startswith("tcp://"):
        command = [sys.executable, "-m", "pescheduler", "status", "--cluster", key]
        page = f"http://127.0.0.1:{shell.ports['8787']}/pescheduler"
    else:
        command = [sys.executable, "-m", "pescheduler", "status", key]
        page = None

    def runs():
        assert proc.poll() is None, f"`{shlex.join(argv)}` ended: {shell.log(proc)}"
        return shell.run(command).returncode == 0
    until(runs, BOUND, f"`{shlex.join(command)}` to find {key}")
    # The "running on …; dashboard …" line comes when deploy() returns, which may be after `status`
    # already finds the deployment (it is registered inside deploy): wait for the line.
    def printed():
        assert "running on" in shell.log(proc) or proc.poll() is None, f"ended: {shell.log(proc)}"
        return "running on" in shell.log(proc)
    until(printed, BOUND, f"`{shlex.join(argv)}` to print its running line")
    if key.startswith("tcp://"):                     # the start line names the cluster's dashboard too
        assert f"dashboard {page}" in shell.log(proc), shell.log(proc)
    if page is None:                                 # the link the deploy printed
        found = re.search(r"dashboard (http://127\.0\.0\.1:\d+/pescheduler)", shell.log(proc))
        assert found, shell.log(proc)
        page = found.group(1)
    until(lambda: all(op in (shown := get(page)) for op in ("map-2", "window-5")) and "cars" in shown, BOUND,
          f"{page} to draw the cars PEs")
    if key.startswith("tcp://"):
        metrics = get(page.replace("/pescheduler", "/metrics"))
        assert 'pescheduler_deployment_running{' in metrics and 'app="cars"' in metrics


def answers(argv: list[str]) -> bool:
    port = int(option(argv, "--port"))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def worker_joined(shell: Terminal, argv: list[str], n: int) -> None:
    """Until the scheduler counts ``n`` workers (the guide's next line deploys onto them)."""
    from distributed import Client

    address = next(a for a in argv if a.startswith("tcp://"))
    with Client(address, timeout=30) as client:
        until(lambda: len(client.scheduler_info()["workers"]) >= n, BOUND, f"{n} workers on {address}")
