"""The wire specs: what the deploying process sends a PE host to build and rewire a PE.

Plain data, shipped with cloudpickle. They live apart from the PE loop
(runtime.py) so the planner (``plan/wiring.py``) and the control plane build
them without importing the worker's runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class OutputSpec:
    """One channel leaving a PE: the upstream port it carries and where it goes."""

    channel_id: str
    src_op: str
    port: str
    dst_pe: str
    dst_worker: str          # Dask worker address of the receiving PE
    dst_data: str            # host:port of that worker's data server
    dst_ops: tuple[str, ...] = ()   # the operators there that consume this port


@dataclass
class InputSpec:
    """One channel arriving at a PE."""

    channel_id: str
    src_op: str
    port: str


@dataclass
class PESpec:
    """Everything a worker needs to build a PE (shipped with cloudpickle)."""

    pe_id: str
    deployment: str
    ops: dict[str, tuple[type, dict, Any]]           # op_id -> (class, parameters, key_field)
    edges: list[tuple[str, str, str]]                # edges whose consumer is in this PE
    inputs: list[InputSpec] = field(default_factory=list)
    outputs: list[OutputSpec] = field(default_factory=list)
    batch_size: int = 1000
    linger_s: float = 0.0     # how long a channel's small batch waits for more (channels.py)
    credits: int = 8
    time_slice_s: float = 0.05
    restore: dict[str, dict] = field(default_factory=dict)   # op_id -> {"state", "progress", "driver"}
    routing: dict[tuple[str, str, str], tuple] = field(default_factory=dict)   # see wiring.routing_for
    copies: dict[str, str] = field(default_factory=dict)     # copy op -> original (whole plan)
    epoch: int = 0            # the Reconfigurer's epoch that created it: older checkpoint barriers are stale
