"""The fork server imports what an embedded worker needs to start and to run its first PE.

Whatever the server has not imported, every forked worker imports itself, after its fork, on the
way to the deployment's first output (issue 34: the command line's first output in 0.8 s). A
module here means CPU in each worker, not a fixed cost; so this checks the list, not a time.
"""

from __future__ import annotations

import json
import subprocess
import sys

# In a new interpreter: the server's imports, then what a worker does next (every source of those
# modules is read where distributed and pescheduler read it, not from the list under test).
WORKER_AFTER_FORK = """
import importlib, json, sys, threading
from pescheduler.control.forkserver import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
assert threading.active_count() == 1, "a preloaded module started a thread: the server cannot fork"
before = set(sys.modules)
import dask.config
import tornado.httpserver
for route in dask.config.get("distributed.worker.http.routes"):   # the worker's HTTP server, as it starts
    importlib.import_module(route)
from pescheduler.plugins import activate
activate(())                                   # every entry point's plug-in: a worker's first PE (pehost)
print(json.dumps(sorted(set(sys.modules) - before)))
"""
WATCHED = ("pescheduler", "distributed", "dask", "tornado", "prometheus_client")


def test_a_forked_worker_imports_none_of_its_start_and_first_pe_after_the_fork():
    out = subprocess.run([sys.executable, "-c", WORKER_AFTER_FORK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    after_fork = [m for m in json.loads(out.stdout.strip().splitlines()[-1]) if m.split(".")[0] in WATCHED]
    assert after_fork == [], f"a forked worker imports these after its fork (add them to PRELOAD): {after_fork}"
