"""The resource-manager interface: hosts borrowed from and returned to a cluster manager.

A *host* is a set of Dask workers (one per core) added to or removed from the
streaming cluster as a unit. A resource manager only grants and takes back
hosts; the controller decides what runs where, and policies decide when to
borrow or return (they see a :class:`ResourceView`).

Implementations are plug-ins (``pescheduler_resource_managers()`` hook): the
embedded default ``local`` and ``spark`` (Spark dynamic allocation). A class
is built as ``cls(scheduler_address, settings)``: the Dask scheduler its hosts'
workers join, and its ``pescheduler.rm.<name>`` settings (a dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol, runtime_checkable


@dataclass(frozen=True)
class Host:
    """A borrowed host: its id and the Dask worker addresses it brings."""

    host_id: str
    workers: tuple[str, ...] = ()
    info: dict = field(default_factory=dict, compare=False)     # backend details (executor id, pids)


@dataclass(frozen=True)
class HostAvailable:
    """A host was granted and its workers have joined the cluster."""

    host: Host


@dataclass(frozen=True)
class HostReturnRequested:
    """The cluster manager wants ``host`` back by ``deadline`` (``time.time()`` seconds)."""

    host: Host
    deadline: float


@dataclass(frozen=True)
class HostLost:
    """``host`` went away without being returned (its workers are gone)."""

    host: Host
    reason: str = ""


RMEvent = HostAvailable | HostReturnRequested | HostLost


@dataclass(frozen=True)
class ReturnRequest:
    """A pending request to give ``host`` back before ``deadline`` (``time.time()`` seconds)."""

    host: str
    deadline: float


@dataclass(frozen=True)
class ResourceView:
    """What policies see of the resource manager (immutable).

    ``held``: hosts the deployment holds now (the initial ones included);
    ``borrowed``: those of them that were borrowed and may be returned;
    ``lendable``: how many more hosts a ``BorrowHosts`` could get now (an
    estimate: the manager may still grant fewer); ``pending_returns``: hosts
    the manager wants back, with deadlines; ``budget``: what bounds the
    lending, from the manager's optional ``host_budget()`` (the ``local``
    manager: the cores here and who uses them).
    """

    held: tuple[str, ...] = ()
    borrowed: tuple[str, ...] = ()
    lendable: int = 0
    pending_returns: tuple[ReturnRequest, ...] = ()
    manager: str = "none"
    budget: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class ResourceManager(Protocol):
    """Grants and takes back hosts. Every method may be slow; none may block the event loop."""

    name: str

    async def start(self, on_event: Callable[[RMEvent], Awaitable[None]]) -> None:
        """Connect to the cluster manager; events arrive through ``on_event``."""

    async def request_hosts(self, n: int) -> list[Host]:
        """Ask for ``n`` hosts; returns those granted (may be fewer, or none)."""

    async def return_host(self, host: Host) -> None:
        """Give ``host`` back (its workers are already empty of PEs)."""

    def lendable(self) -> int:
        """How many more hosts ``request_hosts`` could grant now (an estimate, cheap, no I/O)."""

    async def close(self) -> None:
        """Return everything still held, stop what it started, and disconnect."""


class ResourceManagerUnavailable(RuntimeError):
    """The resource manager cannot be reached or refuses; the message says why and what to do."""
