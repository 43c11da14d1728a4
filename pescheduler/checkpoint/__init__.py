"""Checkpoints: the coordinator, storage, restore (docs/checkpoints.md).

The PE's side of a barrier is ``pescheduler/worker/barriers.py``; recovery
from a loss, which drives the whole deployment, is ``pescheduler/control/recovery.py``; the
sources' ``position()/seek()`` and the sinks' commit hooks are the operator
contract (``pescheduler/operator.py``).
"""

from .coordinator import CheckpointCoordinator, CompletedCheckpoint
from .storage import CheckpointStore, default_location

__all__ = ["CheckpointCoordinator", "CheckpointStore", "CompletedCheckpoint", "default_location"]
