"""What ``deploy(checkpoint=..., checkpoint_interval=..., restore=...)`` asks for, checked before
anything starts (a bad storage or an unknown checkpoint id is a usage error)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dask.utils import parse_timedelta

from .. import config
from ..errors import CheckpointError
from .keys import checkpoint_key
from .storage import CheckpointStore, default_location


@dataclass(frozen=True)
class CheckpointSettings:
    store: CheckpointStore
    interval: float            # seconds
    timeout: float
    retain: int
    restore_id: int | None     # the checkpoint to start from (None: from the beginning); its run: store.origin


def checkpoint_settings(app_name: str, checkpoint: Any, interval: Any, restore: Any) -> CheckpointSettings | None:
    """``None`` when checkpointing is off; the storage opened and ``restore`` resolved otherwise.

    ``checkpoint``: an fsspec URL or directory, or ``True`` for ``pescheduler.checkpoint.storage``
    (by default ``<state-dir>/../checkpoints/<app name>``).
    """
    if checkpoint is None or checkpoint is False:
        if restore is not None or interval is not None:
            raise CheckpointError("restore= and checkpoint_interval= need checkpoint= (the storage: a "
                                  "directory or fsspec URL, or True for the default)")
        return None
    url = (config.get("checkpoint.storage") or default_location(app_name)) if checkpoint is True else str(checkpoint)
    try:
        store = CheckpointStore(url, checkpoint_key())
    except (OSError, ValueError, ImportError) as exc:
        raise CheckpointError(f"checkpoint storage {url!r} cannot be opened: {type(exc).__name__}: {exc}") from None
    try:
        every = (float(parse_timedelta(interval, default="seconds")) if interval is not None
                 else config.get_seconds("checkpoint.interval"))
    except (TypeError, ValueError, KeyError):
        every = -1.0
    if every <= 0:
        raise CheckpointError(f"checkpoint_interval must be positive, got {interval!r}")
    if restore is not None:
        store.start_from(restore)
    return CheckpointSettings(store, every, config.get_seconds("checkpoint.timeout"),
                              int(config.get("checkpoint.retain")),
                              store.origin[1] if store.origin else None)


def refuse_unreplayable(app, plugins) -> None:
    """Checkpoints need sources that can rewind: a source whose ``position()`` raises
    :class:`~pescheduler.errors.NotReplayable` (a one-shot iterator) is refused with its reason,
    before any worker starts. Sources are built here with the app's parameters and not opened."""
    for node in app.nodes.values():
        if node.kind != "source" or (node.kind, node.name) not in plugins.operators:
            continue                          # an unknown name: the compiler says so
        try:
            plugins.operator(node.name, "source")(**node.params).position()
        except NotImplementedError:
            pass                              # its snapshot() holds where it is
