"""What the checkpoint coordinator needs of the control plane that drives it, as typing ports.

``checkpoint/`` imports nothing of ``control/`` (tests/unit/test_layers.py):
the control plane hands the coordinator its gateway, its reconfigurer and its
state machine, and these protocols say which of their members the coordinator
uses (``control/gateway.py``, ``control/reconfigurer.py``, ``control/state.py``
implement them).
"""

from __future__ import annotations

from typing import AsyncContextManager, Iterable, Protocol

from ..plan.placement import Placement


class CheckpointCalls(Protocol):
    """The calls to the PE hosts a checkpoint makes (``WorkerGateway``)."""

    worker_timeout: float

    async def ckpt_begin(self, worker: str, checkpoint_id: int, pe_ids: list[str], epoch: int) -> None: ...

    async def ckpt_wait(self, worker: str, checkpoint_id: int, pe_ids: list[str], timeout: float) -> dict: ...

    async def ckpt_write(self, worker: str, checkpoint_id: int, pe_ids: list[str], storage: str) -> dict: ...

    async def ckpt_progress(self, worker: str, checkpoint_id: int) -> int | None: ...

    async def ckpt_end(self, workers: Iterable[str], checkpoint_id: int, complete: bool) -> None: ...


class LayoutLock(Protocol):
    """The reconfiguration lock, taken with a name for what holds it (``control/reconfigurer.py``)."""

    def held(self, by: str) -> AsyncContextManager[None]: ...

    def locked(self) -> bool: ...


class Layout(Protocol):
    """The layout a checkpoint is taken of, under its lock (``Reconfigurer``)."""

    lock: LayoutLock
    placement: Placement
    epoch: int
    deployment: str


class Lifecycle(Protocol):
    """Whether the deployment runs, and its event log (``DeploymentState``)."""

    state: str

    @property
    def live(self) -> bool: ...

    def event(self, kind: str, text: str) -> None: ...
