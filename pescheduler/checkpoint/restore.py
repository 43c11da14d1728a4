"""From a stored checkpoint to the ``spec.restore`` of each operator of a (new) placement.

The placement that took the checkpoint is stored beside its state, so a
restore onto a different placement (other workers, no copies any more, a
re-compiled app) maps state by operator id through the very function a
reconfiguration uses (``plan/state.py``'s ``redistribute``): a KEYED operator whose
instances differ gets its key groups merged and re-split, a partitioned
source its partitions spread again.
"""

from __future__ import annotations

import cloudpickle

from ..plan.state import redistribute
from ..plan.placement import Placement
from .storage import CheckpointStore


def load_states(store: CheckpointStore, checkpoint_id: int, placement: Placement) -> dict[str, dict]:
    """``op_id -> {"state", "progress", "driver", "position", "checkpoint"}`` for ``placement``."""
    manifest = store.manifest(checkpoint_id)
    taken_by = cloudpickle.loads(store.read(checkpoint_id, manifest["placement_file"]))
    states: dict[str, dict] = {}
    for entry in manifest["files"].values():
        blob = cloudpickle.loads(store.read(checkpoint_id, entry["path"]))
        ops = cloudpickle.loads(blob["ops"])
        for op_id, saved in ops.items():
            saved["position"] = blob["positions"].get(op_id)
        states.update(ops)
    mapped = redistribute(taken_by, placement, states)
    return {op_id: {**saved, "checkpoint": checkpoint_id} for op_id, saved in mapped.items()}
