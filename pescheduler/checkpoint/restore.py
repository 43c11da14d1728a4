"""From a stored checkpoint to the ``spec.restore`` of each operator of a (new) placement.

The placement that took the checkpoint is stored beside its state, so a
restore onto a different placement (other workers, no copies any more, a
re-compiled app) maps state by operator id through the very function a
reconfiguration uses (``plan/state.py``'s ``redistribute``): a KEYED operator whose
instances differ gets its key groups merged and re-split, a partitioned
source its partitions spread again. It is stored without operator parameters
(a Kafka ``sasl.password``, a URL with a password): the mapping reads only the
old placement's instances and routes, and the new placement's parameters.

Every file is read through :meth:`CheckpointStore.read`, which checks its size
and signature before anything is unpickled; a damaged checkpoint falls back to
the previous one this run may restore, with the reason logged. Keyed state is
not read here: a KEYED operator's key groups are references to their files
(``state/incremental.py``), mapped like any state, and the worker that gets a
group reads its files (checked again there). Here those files are only hashed,
in chunks, so a damaged one (of this checkpoint or an earlier one it
references) falls back as well, with memory independent of the state's size.
"""

from __future__ import annotations

import io
import logging

import cloudpickle

from ..errors import CheckpointDamaged, CheckpointError
from ..plan.placement import LogicalOp, Placement
from ..plan.state import redistribute
from ..state.incremental import load_snapshot, load_state_file, with_entries
from .storage import CheckpointStore

logger = logging.getLogger(__name__)


class _WithoutParameters(cloudpickle.Pickler):
    """Pickles a placement with every operator's parameters left out (they may hold secrets)."""

    def reducer_override(self, obj):
        if type(obj) is LogicalOp:
            return LogicalOp, (obj.op_id, obj.kind, obj.name, obj.cls, {}, obj.inputs, obj.key_field)
        return super().reducer_override(obj)


def placement_blob(placement: Placement) -> bytes:
    """The placement as a checkpoint stores it: instances, PEs and routes, no parameters."""
    buffer = io.BytesIO()
    _WithoutParameters(buffer).dump(placement)
    return buffer.getvalue()


def load_states(store: CheckpointStore, checkpoint_id: int, placement: Placement) -> dict[str, dict]:
    """``op_id -> {"state", "progress", "driver", "position", "checkpoint"}`` for ``placement``, from
    ``checkpoint_id`` or, if it is damaged, the newest older one this run may restore (logged;
    ``"checkpoint"`` says which was loaded, and ``store.origin`` too when it is another run's)."""
    reasons = []
    for candidate in reversed([i for i in store.restorable() if i <= checkpoint_id] or [checkpoint_id]):
        try:
            states = _load(store, candidate, placement)
        except CheckpointDamaged as exc:
            logger.warning("%s is damaged, not restored: %s", store.describe(candidate), exc)
            reasons.append(f"{candidate}: {exc}")
            continue
        if candidate in store.borrowed:          # the status names what this run started from
            store.origin = (store.borrowed[candidate], candidate)
        return states
    raise CheckpointError(f"no intact checkpoint to restore in {store.url} ({'; '.join(reasons)})")


def _load(store: CheckpointStore, checkpoint_id: int, placement: Placement) -> dict[str, dict]:
    """One checkpoint's states mapped onto ``placement``; every file verified before it is unpickled."""
    manifest = store.manifest(checkpoint_id)
    placement_file = next(e for e in manifest["files"] if e["role"] == "placement")
    taken_by = cloudpickle.loads(store.read(placement_file, manifest["run"]))
    states, keyed = saved_states(store, manifest)
    mapped = redistribute(taken_by, placement, states)
    where = {"storage": store.storage} if keyed else {}       # the workers read the key groups' files there
    return {op_id: {**saved, "checkpoint": checkpoint_id, **where} for op_id, saved in mapped.items()}


def saved_states(store: CheckpointStore, manifest: dict) -> tuple[dict[str, dict], bool]:
    """``op_id -> saved state`` (with its ``"position"``) of every PE a checkpoint's ``manifest``
    lists, as the placement that took it held them, and whether any of them holds key groups:
    a KEYED operator's groups stay references to their files, which are only hashed here."""
    run = manifest["run"]
    groups = [e for e in manifest["files"] if e["role"] == "group"]
    for entry in groups:                      # hashed in chunks: read by the workers, not held here
        store.files.check(entry, entry.get("run", run))
    states: dict[str, dict] = {}
    keyed = bool(groups)                      # key groups to read (some may be held in .state files only)
    for entry in (e for e in manifest["files"] if e["role"] == "state"):
        blob = load_state_file(store.read(entry, run))
        keyed = keyed or bool(blob["groups"])
        ops = load_snapshot(blob["ops"], with_entries(blob["groups"], manifest["files"],
                                                     lambda e: store.read(e, run)))
        for op_id, saved in ops.items():
            saved["position"] = blob["positions"].get(op_id)
        states.update(ops)
    return states, keyed
