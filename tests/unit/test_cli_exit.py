"""``python -m pescheduler stop`` ends without the interpreter's teardown of what it imported.

That teardown (every module's objects freed, dask's among them) cost `stop` 40-150 ms after its
answer was printed (issue 34: `stop` in 0.3 s). What an exit must still do, it does: the atexit
handlers run, the output is flushed, the exit code is the command's.
"""

from __future__ import annotations

import subprocess
import sys

# Exactly what ``python -m pescheduler stop NAME`` runs, with a probe: an object freed only by the
# teardown says so, and an atexit handler says it ran.
RUN = """
import atexit, runpy, sys, types
class Freed:
    def __del__(self):
        sys.__stdout__.write("torn down\\n")
probe = types.ModuleType("teardown_probe")
probe.keep = Freed()
sys.modules["teardown_probe"] = probe
atexit.register(lambda: sys.__stdout__.write("atexit ran\\n"))
sys.argv = ["pescheduler", "stop", "nobody-runs-this"]
runpy.run_module("pescheduler", run_name="__main__", alter_sys=True)
"""


def test_stop_exits_with_its_code_and_output_but_without_the_teardown(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PESCHEDULER__STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr                    # no deployment of that name: 1, as before
    assert "no deployment named 'nobody-runs-this'" in done.stderr
    assert done.stdout.splitlines() == ["atexit ran"], done.stdout
