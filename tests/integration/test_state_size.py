"""Each PE's state as the last complete checkpoint found it: in ``dep.checkpoints()``, in the
monitor's snapshot that policies receive, in the status and in the Prometheus metrics.

A count window holding one pending tuple per key, on a real 2-worker embedded cluster, on both
backends. The source holds twice: after KEYS / 10 keys and after KEYS keys (the state grows
tenfold between the holds); at each hold the test takes a checkpoint with ``dep.checkpoint()``
(the interval is an hour), so each meets a state that does not change while it is written, and
one more at the second hold.

The writers' own figures are what the entry carries (nothing is read again to count it): the
PEs' parts add up to the checkpoint's ``state_bytes``, the window's PE holds nearly all of it,
its part grows with its keys, and a checkpoint of the unchanged state writes a few per cent of
the state it references (its groups' files are referenced, not written again)."""

from __future__ import annotations

import pytest

import pescheduler
from pescheduler import Application
from pescheduler.dashboard import METRICS
from waiting import until

pytestmark = pytest.mark.integration

WAIT = 120
KEYS = 20_000
WINDOW = 2


@pytest.mark.parametrize("backend", ["memory", "disk"])
def test_each_pe_s_state_is_shown_as_the_last_checkpoint_found_it(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))
    held = (tmp_path / "grown", tmp_path / "done")
    app = Application(f"sizes-{backend}")
    (app.source("numbers", count=2 * KEYS * WINDOW, keys=KEYS, hold_at=(KEYS // 10, KEYS),
                release=tuple(map(str, held))).key_by("key")
        .window(count=WINDOW, aggregates={"total": ("sum", "n")}).sink("collect"))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], state=backend,
                            checkpoint=str(tmp_path / "ckpt"), checkpoint_interval="1h") as dep:
        placement = dep.placement()
        op = next(x for x in placement.plan.ops if x.startswith("count_window"))
        window_pe = placement.pe_of(op)
        assert all(m.state_bytes is None for m in dep.snapshot().pes.values())
        parts = []
        for keys, release in ((KEYS // 10, held[0]), (KEYS, held[1])):
            until(lambda: op in (ops := dep.snapshot().operators) and ops[op].tuples_in >= keys, WAIT,
                  f"the fill of {keys} keys")
            checkpoint_id = dep.checkpoint(timeout=WAIT)
            entry = next(c for c in dep.checkpoints() if c["id"] == checkpoint_id)
            pes = entry["pes"]
            assert set(pes) == set(placement.pes) and pes[window_pe]["operators"] == list(placement.pes[window_pe].operators)
            assert sum(p["state_bytes"] for p in pes.values()) == entry["state_bytes"]
            assert sum(p["bytes"] for p in pes.values()) <= entry["bytes"]      # and the placement's, the manifest
            assert pes[window_pe]["state_bytes"] > 0.9 * entry["state_bytes"], pes
            # what policies receive: the monitor's next window carries each PE's figure
            snap = dep.next_snapshot(timeout=WAIT)
            assert {pe: m.state_bytes for pe, m in snap.pes.items()} == {pe: p["state_bytes"] for pe, p in pes.items()}
            row = next(r for r in dep.status()["pes"] if r["name"] == window_pe)
            assert row["state_bytes"] == pes[window_pe]["state_bytes"]
            parts.append(pes[window_pe])
            if release is held[0]:
                release.touch()
        again = dep.checkpoints()[-1]["id"] + 1
        assert dep.checkpoint(timeout=WAIT) == again        # nothing changed since the last one
        unchanged = dep.checkpoints()[-1]["pes"][window_pe]
        held[1].touch()
        status = dep.status()
    small, large = parts
    print(f"{backend}: the window's state {small['state_bytes']} -> {large['state_bytes']} bytes "
          f"for {KEYS // 10} -> {KEYS} keys; unchanged, a checkpoint wrote {unchanged['bytes']} of "
          f"{unchanged['state_bytes']}")
    assert 5 * small["state_bytes"] < large["state_bytes"] < 20 * small["state_bytes"]
    # its key groups referenced, not written again: only its small .state file
    assert abs(unchanged["state_bytes"] - large["state_bytes"]) < 0.01 * large["state_bytes"]
    assert unchanged["bytes"] < 0.05 * unchanged["state_bytes"]
    exported = {row[0][0]: row[1] for kind, name, _, _, rows in METRICS if name == "pescheduler_pe_state_bytes"
                for row in rows(status)}
    assert exported[next(r["pe"] for r in status["pes"] if r["name"] == window_pe)] == large["state_bytes"]
