"""What a deploy's start-up costs: embedded workers forked from the fork server vs started by command line.

    python bench/startup.py [--quick] [--workers 3] [--repeat 5]

Each run is a fresh ``python`` process, as a user's script is: it imports
pescheduler, deploys a 1,000-event app on an embedded cluster of ``--workers``
workers, waits for its output and stops. Timed inside it: ``deploy()`` called to
``wait()`` returned (the user's time to a first complete result); measured
outside it: the CPU-seconds of the process and everything it started.

  (a) command line: each worker is ``python -m distributed.cli.dask_worker`` (what
      the embedded cluster did before), the baseline
  (b) forked: each worker is a fork of one process that imported distributed and
      pescheduler once (:mod:`pescheduler.control.forkserver`)

Printed: median and best seconds and CPU-seconds of each over ``--repeat``
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
    parser.add_argument("--quick", action="store_true", help="one run of each (a smoke test)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.workers, args.out)
    repeat = 1 if args.quick else args.repeat
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for variant in VARIANTS:
                runs[variant].append(run(variant, args.workers, tmp))
    print(f"deploy start-up, {args.workers} embedded workers, {EVENTS:,} events, {repeat} interleaved runs each")
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
