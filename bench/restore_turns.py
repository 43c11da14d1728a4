"""The stream's stalls while a restored PE's key groups load (issue 30, lazy restore's group import).

In one process, a real PE host restores ``latest`` (KEYED, its rows in the chosen backend) from a
real checkpoint of K rows (about 180 bytes of Python per row, as bench/state.py part 6) and starts
at once; its loader reads the 128 key groups in the background (``worker/lazy_restore.py``).
Meanwhile updates of keys of the first group loaded come every 2 ms, and ``latest``'s outputs are
stamped: the largest gap between outputs while groups load is the stream's worst stall. Each
group's import in the PE's turn (``import_groups``) is timed: how many took over 20 ms.

    python bench/restore_turns.py build K DIR          # the checkpoint, once (10^7: under the lock)
    python bench/restore_turns.py run BACKEND DIR      # one restore: a JSON row

Run ``run`` with another checkout first on ``PYTHONPATH`` to compare with its code (interleave
them: figures of a loaded machine compare only within one run).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from types import SimpleNamespace

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # operators/ (after the checkout's)

import cloudpickle  # noqa: E402

from pescheduler import MIN_WATERMARK  # noqa: E402
from pescheduler.operator import Sink  # noqa: E402

DEP = "dep-restore-turns"
IN = f"{DEP}/0/src.out->pe"
KEY = b"k" * 32
PACE_S = 0.002          # an update every 2 ms while the groups load
SLOW_MS = 20.0


def row(i: int) -> dict:
    return {"id": i, "v": i, "slots": [i, float(i), -i, 1.5]}


class Stamps(Sink):
    """Each output's arrival time (perf_counter)."""

    name = "stamps"

    def __init__(self) -> None:
        self.at: list[float] = []
        self.items: list = []

    def process(self, batch, emit):
        now = time.perf_counter()
        self.at.extend(now for _ in batch)
        self.items.extend(batch)


def build(k: int, where: str) -> None:
    """A checkpoint of ``k`` rows of ``latest`` in ``where``, and its restore entry (restore.pkl)."""
    from pescheduler.checkpoint import CheckpointStore
    from pescheduler.state import open_state
    from pescheduler.state.groups import snapshot_groups
    from pescheduler.state.incremental import pickle_snapshot
    from pescheduler.worker.ckpt_files import CheckpointFiles

    rows = open_state("memory")
    step = 1_000_000
    for start in range(0, k, step):
        rows.write_many({i: row(i) for i in range(start, min(k, start + step))})
    store, files = CheckpointStore(os.path.join(where, "ckpt"), KEY), CheckpointFiles()
    blob, views = pickle_snapshot({"state": {"state": {"groups": snapshot_groups(rows)}, "progress": None,
                                             "driver": None}})
    files.hold(DEP, 1, "pe", {"state": blob, "views": views, "positions": {}})
    written = files.write(DEP, 1, ["pe"], store.url)["pe"]["files"]
    store.commit_manifest(1, {"id": 1, "files": written})
    files.end(DEP, 1, complete=True)
    with open(os.path.join(where, "restore.pkl"), "wb") as f:
        cloudpickle.dump({"k": k, "storage": store.storage, "run": store.run}, f)


def restored(where: str) -> dict:
    """``latest``'s restore entry, every file checked as a recovery checks them."""
    from pescheduler.checkpoint import CheckpointStore
    from pescheduler.checkpoint.restore import saved_states

    with open(os.path.join(where, "restore.pkl"), "rb") as f:
        saved = cloudpickle.load(f)
    store = CheckpointStore(saved["storage"], KEY, run=saved["run"])
    state = saved_states(store, store.verify(1))[0]["state"]
    state["progress"] = ({"src": MIN_WATERMARK}, MIN_WATERMARK, ["src"], False)
    return {"k": saved["k"], "restore": {**state, "checkpoint": 1, "storage": store.storage}}


async def one_run(backend: str, where: str) -> dict:
    import dask.config

    from operators.latest import Latest
    from pescheduler.state import key_group
    from pescheduler.worker import handshake
    from pescheduler.worker.channels import DATA
    from pescheduler.worker.pehost import PEHost
    from pescheduler.wire import InputSpec, PESpec

    saved = restored(where)
    k = saved["k"]
    spec = PESpec("pe", DEP, {"state": (Latest, {"key": "id"}, "id"), "sink": (Stamps, {}, None)},
                  [("src", "out", "state"), ("state", "out", "sink")], inputs=[InputSpec(IN, "src", "out")],
                  restore={"state": saved["restore"]})
    with dask.config.set({"pescheduler.state.dir": os.path.join(where, f"worker-{os.getpid()}"),
                          "pescheduler.state.cache": "512MB"}):
        host = PEHost(SimpleNamespace(address="tcp://127.0.0.1:turns", handlers={}, ip="127.0.0.1"))
        await host.start()
        host.pe_secret(DEP, handshake.new_secret(), state=backend)
        try:
            t0 = time.perf_counter()
            await host.pe_deploy(cloudpickle.dumps([spec]), start=True)
            pe = host.pes[(DEP, "pe")]
            loader = host.loaders.get((DEP, "pe")) or pe.loader
            op, imports, turns = pe.ops["state"], pe.ops["state"].import_groups, []

            def timed(part):
                t = time.perf_counter()
                imports(part)
                turns.append((time.perf_counter() - t) * 1000)
            op.import_groups = timed
            hot_group = key_group(0)
            hot = [i for i in range(min(k, 200_000)) if key_group(i) == hot_group][:1000]
            sink = pe.ops["sink"]
            put = lambda i, v: pe.ports.inbox.put(pe.ports.receivers[IN], DATA,
                                                  [{"op": "update", "id": i, "after": {"id": i, "v": v}}])
            put(hot[0], -1)
            deadline = time.monotonic() + 600
            while not sink.at and time.monotonic() < deadline:
                await asyncio.sleep(PACE_S)
            first_s = time.perf_counter() - t0
            start = time.perf_counter()
            n = 0
            while pe.loader is not None and pe.state == "running" and time.monotonic() < deadline:
                n += 1
                put(hot[n % len(hot)], n)
                await asyncio.sleep(PACE_S)      # the pace of the stream, not a wait for anything
            loaded_s = time.perf_counter() - t0
            end = time.perf_counter()
            assert pe.state == "running", pe.error
            at = [t for t in sink.at if start <= t <= end]
            gaps = sorted(b - a for a, b in zip(at, at[1:]))
            return {"backend": backend, "k": k, "first_output_s": round(first_s, 3), "loaded_s": round(loaded_s, 1),
                    "groups": len(turns), "slow_imports": sum(t > SLOW_MS for t in turns),
                    "longest_import_ms": round(max(turns, default=0), 1),
                    "import_p50_ms": round(sorted(turns)[len(turns) // 2], 1) if turns else None,
                    "max_gap_ms": round(1000 * gaps[-1], 1) if gaps else None,
                    "gap_p50_ms": round(1000 * gaps[len(gaps) // 2], 2) if gaps else None,
                    "gaps_over_20ms": sum(g > SLOW_MS / 1000 for g in gaps), "outputs": len(at),
                    "load": round(os.getloadavg()[0], 1)}
        finally:
            await host.close()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        build(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        import pescheduler
        row_ = asyncio.run(one_run(sys.argv[2], sys.argv[3]))
        row_["code"] = os.path.dirname(os.path.dirname(pescheduler.__file__))
        print(json.dumps(row_), flush=True)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
