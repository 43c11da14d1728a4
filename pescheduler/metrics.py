"""The metrics snapshot policies receive: per operator, PE, worker and host, immutable.

A contract type: the monitor (``control/monitor.py``) builds it, policies,
the simulator and the status read it. It lives outside ``control/`` so a
policy imports what it is given without importing the control plane.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class OperatorMetrics:
    """One operator over the last interval (rates) and since start (totals)."""

    op_id: str
    pe: str
    tuples_in_per_s: float = 0.0
    tuples_out_per_s: float = 0.0
    busy: float = 0.0                # seconds per second in this operator's code, CPU waits excluded
    tuples_in: int = 0
    tuples_out: int = 0
    dead_letters: int = 0
    late: int = 0
    lag: Mapping[str, int] = field(default_factory=dict, hash=False)   # source: records behind per partition
    lag_per_s: float = 0.0           # source: change of the total lag per second (< 0: catching up)
    batches_in_per_s: float = 0.0    # batches it took (tuples_in_per_s / this: tuples per batch)


@dataclass(frozen=True)
class PEMetrics:
    """One PE over the last interval; fractions of wall time sum to about 1."""

    pe: str
    operators: tuple[str, ...]
    worker: str
    host: str
    state: str = "running"
    tuples_in_per_s: float = 0.0
    tuples_out_per_s: float = 0.0
    busy: float = 0.0
    backpressure: float = 0.0
    idle: float = 0.0
    queue_batches: int = 0
    queue_tuples: int = 0
    max_queue_batches: int = 0
    backpressure_s: float = 0.0      # cumulative seconds blocked on credit
    threaded: bool = False           # its operators block or run long: it works in its own thread
    threaded_because: str = ""       # why, while it does ("a turn took 140 ms", "sink may wait on deliveries")
    # the bytes of state it referenced at the last complete checkpoint (its key groups' files, held
    # wherever, and its own): None before one of this PE (these operators) completed or without
    # checkpoints. As of that checkpoint: a Replicate's new copy, a Fuse's or Split's PE have none
    # until the next one, a Replicate's original the old figure
    state_bytes: int | None = None


@dataclass(frozen=True)
class WorkerMetrics:
    """A worker process: CPU as a fraction of one core, resident memory, and ``cores``: the CPU
    one PE there can use (a thread: one core, or less under a quota such as a lab host's half core;
    a policy sizing by CPU seconds needs it to know what an instance there can process)."""

    worker: str
    host: str
    cpu: float = 0.0
    memory_bytes: int = 0
    cores: float = 1.0


@dataclass(frozen=True)
class HostMetrics:
    """A host: the deployment's CPU as a fraction of the cores it may use there (its quota, or
    its machine's cores), memory in use as a fraction, and the CPU everything on the host uses
    (``machine_cpu``, other tenants included)."""

    host: str
    cpu: float = 0.0
    memory: float = 0.0
    workers: tuple[str, ...] = ()
    machine_cpu: float = 0.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """The last monitor window, as policies receive it (immutable)."""

    time: float
    interval_s: float
    operators: Mapping[str, OperatorMetrics] = field(default_factory=dict)
    pes: Mapping[str, PEMetrics] = field(default_factory=dict)
    workers: Mapping[str, WorkerMetrics] = field(default_factory=dict)
    hosts: Mapping[str, HostMetrics] = field(default_factory=dict)

    def saturated(self, host: str, limit: float | None) -> str | None:
        """Why ``host`` has no more CPU to give (its CPU use, all cores, above ``limit``), or None:
        a busy PE there needs more CPU, but a copy on that host would only share what it has."""
        h = self.hosts.get(host)
        if limit is None or h is None or h.cpu <= limit:
            return None
        return f"host {host!r} has no more CPU: the deployment uses {h.cpu:.0%} of its cores (above {limit:.0%})"

    @property
    def dead_letters(self) -> int:
        return sum(o.dead_letters for o in self.operators.values())

    @property
    def late_events(self) -> int:
        return sum(o.late for o in self.operators.values())
