"""Deployed: the first checkpoint after an aborted one writes only what changed (issue 30).

A count window keyed over 2,000 keys (every key group holds some) on a real 2-worker cluster, its
stream held, replicated; then a checkpoint is aborted after the window's PE took its snapshot (the
source's position fails once), and the next one completes. Before, the window's snapshot number the
worker's writer never saw (the aborted checkpoint's, let go unwritten) broke its chains: the
original rewrote every key group it kept whole (64 of 64 at 20,000 keys in bench's pipeline), for
nothing (bench/state.py part 6 at 10^7 keys: 51 after the Replicate).
"""

from __future__ import annotations

import os
import re

import pytest
from waiting import newest_checkpoint, until

import pescheduler
from pescheduler import Application, Replicate
from pescheduler.checkpoint.storage import manifest_at
from pescheduler.state.incremental import load_state_file

pytestmark = pytest.mark.integration

WAIT = 180
KEYS, HOLD = 2_000, 6_000


def group_files(checkpoint: dict) -> list[str]:
    """Names of the key-group files checkpoint ``checkpoint`` wrote: files of their own, and those
    its PEs' ``.state`` files hold (small groups: ``incremental._Pack``) as the names they would have."""
    files = manifest_at(checkpoint["url"])["files"]
    names = [e["path"].rsplit("/", 1)[-1] for e in files if e["chk"] == checkpoint["id"] and e["role"] == "group"]
    for e in (e for e in files if e["chk"] == checkpoint["id"] and e["role"] == "state"):
        with open(os.path.join(checkpoint["url"], e["path"].rsplit("/", 1)[-1]), "rb") as f:
            held = load_state_file(f.read()).get("deltas", {})
        names += [f"{e['pe']}.{n}.g{g:03d}.{'full' if type(held_file) is bytes else 'delta'}"
                  for n, groups in held.items() for g, held_file in groups.items()]
    return names


def test_the_checkpoint_after_an_aborted_one_writes_no_unchanged_group_whole(cluster, tmp_path):
    flag, release = tmp_path / "abort-once", tmp_path / "release"
    app = Application("checkpoint-after-abort")
    (app.source("aborting_numbers", flag=str(flag), count=HOLD + 10, keys=KEYS, hold_at=HOLD, release=str(release))
        .key_by("key").window(count=7, aggregates={"total": ("sum", "n")}, id="op").sink("collect"))
    with pescheduler.deploy(app, cluster=cluster, plugins=["support_ops"], policies=[],
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="0.3s") as dep:
        until(lambda: getattr(dep.snapshot().operators.get("op"), "tuples_in", 0) >= HOLD, WAIT, "the stream held")
        held = newest_checkpoint(dep)       # the second after the hold began after it: the fill's keys in
        until(lambda: newest_checkpoint(dep) >= held + 2, WAIT, "two checkpoints of the held state")
        rec = dep.apply(Replicate("op", 1), timeout=WAIT)
        assert rec.applied, rec.reason
        replicated = newest_checkpoint(dep)
        until(lambda: newest_checkpoint(dep) > replicated, WAIT, "a checkpoint after the Replicate")
        flag.touch()
        until(lambda: not flag.exists() and dep.status()["checkpoints"]["aborted"] >= 1, WAIT, "the checkpoint aborted")
        error = dep.status()["checkpoints"]["last_error"]
        assert "injected" in error, error
        aborted = int(re.match(r"checkpoint (\d+):", error).group(1))
        until(lambda: newest_checkpoint(dep) > aborted, WAIT, "the next checkpoint complete")
        after = next(c for c in dep.checkpoints() if c["id"] > aborted)     # the first after it
        release.touch()
    original = [name for name in group_files(after) if "#1" not in name]
    whole = [name for name in original if name.endswith(".full")]
    assert len(whole) <= 3, (len(whole), len(original), whole[:5])
