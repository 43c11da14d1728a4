"""The worker processes a deploy starts run on jemalloc (``pescheduler.pe.allocator``), and trim nothing.

glibc's ``malloc_trim`` after a checkpoint's write held each malloc arena's lock through a walk of
all of it; at 10^7 keys the worker's event loop waited 122 ms for it (traced), the stream with it.
On jemalloc the writer does not trim (jemalloc gives memory back as it decays, in threads of its
own). Real embedded clusters, the Debian package installed by the test if missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dask.config
import pytest

import pescheduler
from debian import require_library
from pescheduler import Application, allocator

pytestmark = pytest.mark.integration

WAIT = 120


@pytest.fixture()
def jemalloc():
    found = require_library("jemalloc", "libjemalloc2")
    allocator._jemalloc_library.cache_clear()       # found after this process first looked
    yield found
    allocator._jemalloc_library.cache_clear()


def allocators(tmp_path, setting: str) -> set[str]:
    app = Application(f"alloc-{setting}")
    app.source("generator", events=1000, keys=10, seed=1).sink("jsonl", path=str(tmp_path / f"{setting}.jsonl"))
    with dask.config.set({"pescheduler.pe.allocator": setting}), \
            pescheduler.deploy(app, workers=2, policies=[]) as dep:
        found = {info["allocator"] for info in dep.worker_info.values()}
        assert dep.wait(timeout=WAIT)["state"] == "finished"
    return found


def test_a_deploy_starts_its_workers_on_jemalloc_and_on_the_c_library_when_told(tmp_path, jemalloc):
    assert allocators(tmp_path, "jemalloc") == {"jemalloc"}
    assert allocators(tmp_path, "system") == {"system"}         # the fork server restarted for it
    assert allocators(tmp_path, "jemalloc") == {"jemalloc"}


WRITER_END = """
import json
from pescheduler import allocator
from pescheduler.worker import ckpt_files
print(json.dumps([allocator.in_use(), ckpt_files.give_back(), allocator.start_background_threads()]))
"""


def test_a_checkpoint_writer_on_jemalloc_trims_nothing_and_jemalloc_purges_in_its_own_threads(jemalloc):
    def writer_end(env: dict) -> list:
        done = subprocess.run([sys.executable, "-c", WRITER_END], capture_output=True, text=True, timeout=WAIT,
                              env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    assert writer_end({**plain, "LD_PRELOAD": jemalloc}) == ["jemalloc", False, True]
    assert writer_end(plain) == ["system", True, False]           # glibc: malloc_trim, as before
