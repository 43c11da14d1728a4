"""What a deploy's start-up costs: the command line's phases, and forked vs command-line workers.

    python bench/startup.py [--quick] [--workers 3] [--repeat 5] [--cli-repeat 7] [--part cli|stop|workers]
                            [--against DIR]

Part 1, the command line as a user meets it: ``python -m pescheduler deploy app.py``
(a 100-event ``generator`` -> ``jsonl`` app, the embedded cluster's default size),
a fresh process each run. Timed from the outside: process start -> the first
line in the sink's file -> the process's exit. Timed from the inside (a run of
the same command under a wrapper that marks when each step begins and ends,
interleaved with the plain runs): import, app load and check, cluster start
(scheduler, workers joined), place and launch, drain, stop (the cluster
closed), exit; steps that overlap show so. Median of ``--cli-repeat`` runs.

Part 2, ``stop``: a deployment of an endless app runs under ``--name``; from
the outside, ``python -m pescheduler stop NAME`` from its start to its exit, and
to the exit of the deploying process. Median of ``--cli-repeat`` runs.

``--against DIR`` runs parts 1 and 2 also with another pescheduler, interleaved with this one's runs:
DIR is a venv (its ``bin/python`` runs the commands: e.g. one with an editable install of another
worktree, ``pip install --no-deps -e``), or a checkout (``git archive main | tar -x -C DIR``, first
on ``PYTHONPATH``; not with an editable install of this one, which maps ``pescheduler.operators``
and ``pescheduler.policies`` to its own folders). Commands run
with their modules' bytecode cached, as a pip-installed pescheduler runs (``--no-bytecode``:
the environment as it is).

Part 3, the workers:

Each run is a fresh ``python`` process, as a user's script is: it imports
pescheduler, deploys a 1,000-event app on an embedded cluster of ``--workers``
workers, waits for its output and stops. Timed inside it: ``deploy()`` called to
``wait()`` returned (the user's time to a first complete result); measured
outside it: the CPU-seconds of the process and everything it started.

  (a) command line: each worker is ``python -m distributed.cli.dask_worker`` (what
      the embedded cluster did before), the baseline
  (b) forked: each worker is a fork of one process that imported distributed and
      pescheduler once (:mod:`pescheduler.control.forkserver`)

Printed (part 3): median and best seconds and CPU-seconds of each over ``--repeat``
interleaved runs, (a)/(b), and the load average. Each run checks that its sink
wrote all 1,000 events.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

VARIANTS = ("command line", "forked")
EVENTS = 1000
CLI_EVENTS = 100
# As a pip-installed pescheduler runs: modules load from bytecode. The commands run with their
# bytecode cached under a folder of the run (PYTHONPYCACHEPREFIX; a run before the timed ones
# fills it), even where PYTHONDONTWRITEBYTECODE is set (CI, this project's machines), which
# would compile every module of pescheduler from source at each start (about 0.3 s more).
# --no-bytecode keeps the environment as it is.
ENV: dict[str, str] | None = None
PYTHON = sys.executable   # the interpreter the commands run with (--against VENV: that venv's)
POLL_S = 0.002            # how often the outside looks at the sink file (a benchmark's observer, not a sync)

# ---- part 1 and 2: the command line ----

APP = """from pescheduler import Application
app = Application({name!r})
app.source("generator", events={events}, keys=10, seed=1{rate}).sink("jsonl", path={out!r})
"""

# The steps a run's wrapper marks: (module, attribute path, step). A step called several times
# (``check app`` by the CLI and by deploy(); ``wait`` once per monitor interval) shows its first
# begin, its last end and the sum of its calls. Missing attributes are skipped: the same wrapper
# times older and newer code. ``import`` is the time to ``cli.main``.
STEPS = (
    ("pescheduler.cli", "main", "main"),
    ("pescheduler.apploader", "load_app", "load app"),
    ("pescheduler.apploader", "check_app", "check app"),
    ("pescheduler.control.cluster", "EmbeddedCluster.start", "cluster: scheduler + forks"),
    ("pescheduler.control.cluster", "EmbeddedCluster.wait_for_workers", "cluster: workers joined"),
    ("pescheduler.control.deployment", "compile_app", "place (compile)"),
    ("pescheduler.control.reconfigurer", "Reconfigurer.launch", "launch PEs"),
    ("pescheduler.control.deployment", "Deployment._start", "deploy() to running"),
    ("pescheduler.control.deployment", "Deployment.wait", "run (wait)"),
    ("pescheduler.control.deployment", "Deployment._drain", "drain"),
    ("pescheduler.control.deployment", "Deployment._shutdown", "stop (PEs, client, cluster)"),
    ("pescheduler.control.cluster", "EmbeddedCluster.close", "cluster close"),
)


def _write_app(tmp: str, tag: str, events: int | None, rate: float | None = None) -> tuple[str, str]:
    out = os.path.join(tmp, f"{tag}.jsonl")
    path = os.path.join(tmp, f"{tag}.py")
    with open(path, "w") as f:
        f.write(APP.format(name=tag.replace("_", "-"), events=events, out=out,
                           rate="" if rate is None else f", rate={rate}"))
    return path, out


def _first_line(out: str, proc: subprocess.Popen, t0: float, timeout: float) -> float | None:
    """Seconds from ``t0`` until ``out`` holds a complete line (None: the process ended first)."""
    deadline = t0 + timeout
    while time.time() < deadline:
        try:
            if os.path.getsize(out) > 0:
                return time.time() - t0
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            return None
        time.sleep(POLL_S)
    raise TimeoutError(f"no output in {out} within {timeout} s")


def cli_outside(tmp: str, i: int, label: str = "this") -> dict:
    """A plain ``python -m pescheduler deploy app.py``: start -> first output -> exit, seconds."""
    app, out = _write_app(tmp, f"cli_{label}_{i}", CLI_EVENTS)
    with open(os.path.join(tmp, f"cli_{label}_{i}.err"), "w+") as err:    # a file: a full pipe would block it
        t0 = time.time()
        proc = subprocess.Popen([PYTHON, "-m", "pescheduler", "deploy", app], cwd=tmp, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=err)
        first = _first_line(out, proc, t0, 120)
        proc.wait(timeout=120)
        exited = time.time() - t0
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"deploy failed ({proc.returncode}):\n{err.read()[-3000:]}")
    _check_lines(out, CLI_EVENTS)
    return {"first output": first, "exit": exited}


def cli_inside(tmp: str, i: int, label: str = "this") -> dict[str, tuple[float, float, float]]:
    """The same command under the step-marking wrapper: step -> (first begin, last end, sum), seconds
    since the process started."""
    app, out = _write_app(tmp, f"phases_{label}_{i}", CLI_EVENTS)
    marks = os.path.join(tmp, f"phases_{label}_{i}.json")
    t0 = time.time()
    proc = subprocess.run([PYTHON, __file__, "--phases-child", marks, "--", "deploy", app], cwd=tmp, env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    exited = time.time() - t0
    if proc.returncode != 0:
        sys.exit(f"deploy (phases) failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
    _check_lines(out, CLI_EVENTS)
    with open(marks) as f:
        raw = json.load(f)
    steps = {step: (min(b for b, _ in spans) - t0, max(e for _, e in spans) - t0, sum(e - b for b, e in spans))
             for step, spans in raw.items()}
    steps["exit"] = (steps["main returned"][1], exited, exited - steps["main returned"][1])
    return steps


def _check_lines(out: str, expected: int) -> None:
    with open(out) as f:
        n = sum(1 for _ in f)
    if n != expected:
        sys.exit(f"{out}: {n} events written, {expected} expected")


def phases_child(marks_path: str, argv: list[str]) -> None:
    """``python -m pescheduler ARGV`` in this process, with the :data:`STEPS` marked as they run."""
    import importlib.abc
    import importlib.util
    import inspect
    from functools import wraps

    spans: dict[str, list[tuple[float, float]]] = {}
    started = time.time()

    def patch(module, attr: str, step: str) -> None:
        owner_path, _, name = attr.rpartition(".")
        owner = module
        for part in filter(None, owner_path.split(".")):
            owner = getattr(owner, part, None)
        original = getattr(owner, name, None) if owner is not None else None
        if original is None or getattr(original, "_bench_step", False):
            return
        if inspect.iscoroutinefunction(original):
            @wraps(original)
            async def marked(*args, **kwargs):
                t = time.time()
                try:
                    return await original(*args, **kwargs)
                finally:
                    spans.setdefault(step, []).append((t, time.time()))
        else:
            @wraps(original)
            def marked(*args, **kwargs):
                t = time.time()
                try:
                    return original(*args, **kwargs)
                finally:
                    spans.setdefault(step, []).append((t, time.time()))
        marked._bench_step = True
        setattr(owner, name, marked)

    def patch_module(module) -> None:
        for mod_name, attr, step in STEPS:
            if mod_name == module.__name__:
                patch(module, attr, step)

    class Marker(importlib.abc.MetaPathFinder):
        """Patches a module of :data:`STEPS` right after it is imported (lazily or not)."""

        def find_spec(self, fullname, path, target=None):
            if fullname not in {m for m, _, _ in STEPS}:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch_module(module)
            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, Marker())
    import runpy

    sys.argv = ["pescheduler", *argv]
    code = 1
    try:                                     # exactly what ``python -m pescheduler ARGV`` runs
        runpy.run_module("pescheduler", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    finally:
        main = spans.get("main", [(started, started)])[0]
        spans["import"] = [(started, main[0])]
        spans["main returned"] = [(main[1], main[1])]
        spans.pop("main", None)
        with open(marks_path, "w") as f:
            json.dump(spans, f)
    sys.exit(code)


def stop_run(tmp: str, i: int, label: str = "this") -> dict:
    """``stop NAME`` of a running deployment: from its start to its exit, and to the deploying process's exit."""
    name = f"startup-stop-{os.getpid()}-{label}-{i}"
    app, out = _write_app(tmp, f"stop_{label}_{i}", None, rate=1000)
    with open(os.path.join(tmp, f"stop_{label}_{i}.err"), "w+") as err:   # a file: a full pipe would block it
        deploying = subprocess.Popen([PYTHON, "-m", "pescheduler", "deploy", app, "--name", name], cwd=tmp,
                                     env=ENV, stdout=subprocess.DEVNULL, stderr=err)
        try:
            if _first_line(out, deploying, time.time(), 120) is None:
                err.seek(0)
                sys.exit(f"the deployment to stop ended early:\n{err.read()[-3000:]}")
            t0 = time.time()
            stop = subprocess.run([PYTHON, "-m", "pescheduler", "stop", name], cwd=tmp, env=ENV,
                                  capture_output=True, timeout=120)
            stopped = time.time() - t0
            deploying.wait(timeout=120)
            gone = time.time() - t0
        finally:
            if deploying.poll() is None:
                deploying.kill()
                deploying.wait()
    if stop.returncode != 0 or deploying.returncode != 0:
        sys.exit(f"stop exited {stop.returncode}, deploy {deploying.returncode}:\n{stop.stderr.decode()[-2000:]}")
    return {"stop exits": stopped, "deploy exits": gone}


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def _versions(tmp: str, bytecode: bool, against: str | None) -> dict[str, dict[str, str] | None]:
    """The environments the commands run in: this checkout, and ``against`` (a venv's python, or
    another checkout's folder first on ``PYTHONPATH``), each with its own bytecode cache filled by
    one untimed run. :func:`_use` switches to one."""
    versions: dict[str, dict[str, str] | None] = {"this": None}
    _PYTHONS["this"] = sys.executable
    if against:
        venv_python = os.path.join(os.path.abspath(against), "bin", "python")
        if os.path.exists(venv_python):
            versions["against"], _PYTHONS["against"] = None, venv_python
        else:
            versions["against"], _PYTHONS["against"] = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [os.path.abspath(against), *filter(None, [os.environ.get("PYTHONPATH")])])}, sys.executable
    for label in list(versions):
        if bytecode:
            env = {k: v for k, v in (versions[label] or os.environ).items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, f"pycache-{label}")
            versions[label] = env
        _use(label, versions[label])
        cli_outside(tmp, -1, label)
    return versions


_PYTHONS: dict[str, str] = {}     # label -> the interpreter of that version (_versions)


def _use(label: str, env: dict[str, str] | None) -> None:
    """The commands from now on run ``label``'s version: its interpreter, in ``env``."""
    global ENV, PYTHON
    ENV, PYTHON = env, _PYTHONS.get(label, sys.executable)


def _header(label: str, against: str | None) -> str:
    return f"[{label}{' = ' + against if label == 'against' else ''}]" if against else ""


def cli_part(repeat: int, bytecode: bool, against: str | None) -> None:
    outside: dict[str, list[dict]] = {}
    inside: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        versions = _versions(tmp, bytecode, against)
        for i in range(repeat):                              # interleaved: the same load for each
            for label, env in versions.items():
                _use(label, env)
                outside.setdefault(label, []).append(cli_outside(tmp, i, label))
                inside.setdefault(label, []).append(cli_inside(tmp, i, label))
    print(f"part 1: python -m pescheduler deploy app.py ({CLI_EVENTS} events, embedded cluster), "
          f"median of {repeat} interleaved runs each{'' if bytecode else ', modules compiled at each start'}")
    for label in versions:
        if against:
            print(f"  {_header(label, against)}")
        for what, goal in (("first output", 0.8), ("exit", 1.2)):
            values = [r[what] for r in outside[label] if r[what] is not None]
            print(f"  start -> {what:13s}{_median(values):6.2f} s   (best {min(values):.2f}, goal <= {goal})")
        print(f"  {'step (wrapped run)':30s}{'begins':>8s}{'ends':>8s}{'seconds':>9s}")
        runs = inside[label]
        steps = sorted({s for r in runs for s in r if s != "main returned"},
                       key=lambda s: _median([r[s][0] for r in runs if s in r]))
        for step in steps:
            rows = [r[step] for r in runs if step in r]
            print(f"  {step:30s}{_median([b for b, _, _ in rows]):8.3f}{_median([e for _, e, _ in rows]):8.3f}"
                  f"{_median([d for _, _, d in rows]):9.3f}")
    print("  load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def stop_part(repeat: int, bytecode: bool, against: str | None) -> None:
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        versions = _versions(tmp, bytecode, against)
        for i in range(repeat):
            for label, env in versions.items():
                _use(label, env)
                runs.setdefault(label, []).append(stop_run(tmp, i, label))
    print(f"part 2: python -m pescheduler stop NAME of a running deployment, median of {repeat} interleaved runs"
          f"{'' if bytecode else ', modules compiled at each start'}")
    for label in versions:
        if against:
            print(f"  {_header(label, against)}")
        for what, goal in (("stop exits", " (goal <= 0.3)"), ("deploy exits", "")):
            values = [r[what] for r in runs[label]]
            print(f"  stop start -> {what:13s}{_median(values):6.2f} s   (best {min(values):.2f}){goal}")
    print("  load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


# ---- part 3: forked vs command-line workers ----


def child(variant: str, workers: int, out: str) -> None:
    """One run, in this process: deploy, wait, check, print the seconds as JSON."""
    t0 = time.perf_counter()
    import pescheduler
    from pescheduler.control import cluster
    from pescheduler.resource_managers import processes

    if variant == "command line":
        async def spawn(self):         # the embedded cluster's worker start before the fork server
            name = f"embedded-{self._named}"
            self._named += 1
            log_path = os.path.join(self._log_dir, f"{name}.log")
            cmd = [sys.executable, "-m", "distributed.cli.dask_worker",
                   *cluster.worker_args(self._scheduler.address, name, [], self.host)]
            with open(log_path, "ab") as log:
                popen = subprocess.Popen(cmd, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
            proc = processes.Process(name, popen, log_path)
            self._workers.append(proc)
            return proc
        cluster.EmbeddedCluster._spawn = spawn
    app = pescheduler.Application("startup")
    app.source("generator", events=EVENTS, keys=10, seed=1).sink("jsonl", path=out)
    imported = time.perf_counter()
    with pescheduler.deploy(app, workers=workers, rm="none", policies=[]) as dep:
        dep.wait(timeout=300)
    done = time.perf_counter()
    with open(out) as f:
        n = sum(1 for _ in f)
    print(json.dumps({"import": imported - t0, "deploy_to_result": done - imported, "events": n}))


def run(variant: str, workers: int, tmp: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, __file__, "--child", variant, "--workers", str(workers),
                             "--out", os.path.join(tmp, f"{variant[0]}-{time.monotonic_ns()}.jsonl")],
                            capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit(f"{variant} run failed:\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    if figures["events"] != EVENTS:
        sys.exit(f"{variant}: {figures['events']} events written, {EVENTS} expected")
    figures["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of each variant")
    parser.add_argument("--cli-repeat", type=int, default=7, help="runs of parts 1 (each way) and 2")
    parser.add_argument("--part", choices=("cli", "stop", "workers"), action="append",
                        help="only this part, repeatable (default: all three)")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="parts 1 and 2 in this environment as it is (default: modules load from bytecode)")
    parser.add_argument("--against", metavar="DIR",
                        help="parts 1 and 2 also with the pescheduler of this checkout (e.g. `git archive main`), "
                             "interleaved")
    parser.add_argument("--quick", action="store_true", help="one run of each (a smoke test)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--phases-child", metavar="MARKS", help=argparse.SUPPRESS)
    if "--phases-child" in sys.argv:           # the rest is pescheduler's command line
        at = sys.argv.index("--")
        return phases_child(sys.argv[sys.argv.index("--phases-child") + 1], sys.argv[at + 1:])
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.workers, args.out)
    parts = args.part or ["cli", "stop", "workers"]
    if "cli" in parts:
        cli_part(1 if args.quick else args.cli_repeat, not args.no_bytecode, args.against)
    if "stop" in parts:
        stop_part(1 if args.quick else args.cli_repeat, not args.no_bytecode, args.against)
    if "workers" in parts:
        workers_part(args)


def workers_part(args: argparse.Namespace) -> None:
    repeat = 1 if args.quick else args.repeat
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for variant in VARIANTS:
                runs[variant].append(run(variant, args.workers, tmp))
    print(f"part 3: deploy start-up, {args.workers} embedded workers, {EVENTS:,} events, {repeat} interleaved runs each")
    print(f"{'':16s}{'deploy→result median':>22s}{'best':>8s}{'CPU-s median':>14s}{'import':>8s}")
    median = {}
    for variant in VARIANTS:
        secs = sorted(r["deploy_to_result"] for r in runs[variant])
        cpu = sorted(r["cpu"] for r in runs[variant])
        imp = sorted(r["import"] for r in runs[variant])
        median[variant] = (secs[len(secs) // 2], cpu[len(cpu) // 2])
        print(f"{variant:16s}{secs[len(secs) // 2]:>21.2f}s{secs[0]:>7.2f}s{cpu[len(cpu) // 2]:>13.2f}s"
              f"{imp[len(imp) // 2]:>7.2f}s")
    (a_s, a_cpu), (b_s, b_cpu) = median["command line"], median["forked"]
    print(f"(a)/(b): deploy→result {a_s / b_s:.2f}x, CPU {a_cpu / b_cpu:.2f}x (goal > 1)")
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
