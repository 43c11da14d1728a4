"""The wire specs: what the deploying process sends a PE host to build and rewire a PE.

Plain data, shipped with cloudpickle, and the key-group contract both sides
compute alike. They sit between the layers, imported by both and importing
neither: the planner (``plan/wiring.py``) and the control plane build them,
the worker (``worker/runtime.py``, ``worker/routing.py``) runs them, and
``plan/`` and ``worker/`` import nothing of each other.
"""

from __future__ import annotations

import io
import numbers
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Any


KEY_GROUPS = 128


def key_group(key: Any, groups: int = KEY_GROUPS) -> int:
    """The key group of ``key``: stable across processes (``hash`` of a str is not) and spread
    evenly even for small ints and similar strings (a 64-bit mix over crc32)."""
    if type(key) is int:
        h = key & _MASK
    elif type(key) is str:
        h = zlib.crc32(key.encode())
    else:
        h = key_hash(key)
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & _MASK        # murmur3's fmix64
    h = ((h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53) & _MASK
    return (h ^ (h >> 33)) % groups


def key_hash(key: Any) -> int:
    """The 64-bit value :func:`key_group` mixes for a key that is not a plain int or str. Keys
    Python holds equal share it (``0 == 0.0 == False``, ``numpy.int64(7) == 7``, tuples of
    those): a dict, and so a keyed operator's state, takes them for one key, so a router must
    send them to one copy and a state must file them in one group (a join of an int key column
    with a float one: 0 and 0.0 landed in different groups)."""
    key = _canonical(key)
    if type(key) is int:
        return key & _MASK
    if type(key) is str:
        return zlib.crc32(key.encode())
    if type(key) is tuple:
        return zlib.crc32(tuple_bytes(key))
    return zlib.crc32(pickle.dumps(key, protocol=4))


_FLAT = frozenset((str, int, float, bytes, type(None), bool))   # a tuple of distinct ones has no back-reference


def tuple_bytes(key: tuple) -> bytes:
    """A canonical tuple's pickle (protocol 4) as if no object in it were another's: pickle's
    memo writes an object met twice as a back-reference, so ``(s, s)`` and ``(s, copy of s)``,
    equal keys, pickled apart (and hashed to different key groups). The bytes are those pickle
    writes for a tuple without shared objects (a key group of such a key, the usual one, is the
    one it always was); the memo-free pickler only when the tuple nests or repeats an object."""
    if _FLAT.issuperset(map(type, key)) and len(set(map(id, key))) == len(key):
        return pickle.dumps(key, protocol=4)
    buffer = io.BytesIO()
    _Unshared(buffer, protocol=4).dump(key)
    return buffer.getvalue()


class _Unshared(pickle.Pickler):
    """A pickler that never writes a back-reference: the memo is emptied before each object (the
    memo marks it still writes take no index in protocol 4, so the bytes are an unshared tuple's)."""

    def persistent_id(self, obj: Any) -> None:
        self.clear_memo()
        return None


def _canonical(key: Any) -> Any:
    """An equal key of one type per value: an integral number is an int, a tuple is canonical
    inside."""
    if isinstance(key, float):
        return int(key) if key.is_integer() else float(key)
    if isinstance(key, numbers.Integral):           # bool, numpy's ints
        return int(key)
    if isinstance(key, str) and type(key) is not str:    # numpy.str_ == its str, and hashes alike
        return str(key)
    if type(key) is tuple:
        return tuple(map(_canonical, key))
    return key


_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class RouterTargets:
    """One router's distribution list for one consumer: instances and their weights."""

    instances: tuple[str, ...]
    weights: tuple[int, ...] = ()
    owners: tuple[str, ...] = ()          # KEYED: group -> instance
    by_credit: bool = False               # STATELESS: each batch to the instance with the most room


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
    latency_s: float = 0.0    # the latency target a channel sizes its batches by (channels.py)
    credits: int = 8
    hold: int = 0             # tuples a gated instance may hold (pescheduler.state.hold; pending_groups.py)
    time_slice_s: float = 0.05
    restore: dict[str, dict] = field(default_factory=dict)   # op_id -> {"state", "progress", "driver"}
    routing: dict[tuple[str, str, str], tuple] = field(default_factory=dict)   # see plan/wiring.routing_for
    copies: dict[str, str] = field(default_factory=dict)     # copy op -> original (whole plan)
    epoch: int = 0            # the Reconfigurer's epoch that created it: older checkpoint barriers are stale


def exported_marker(marker: str) -> str:
    """The marker a running instance's PE sends on its output channels in the turn it exports key
    groups during reconfiguration ``marker`` (``worker/handover.py``): the controller sends the
    groups' state on (``control/protocol.py``) only once every PE downstream took it, so what the
    losing instance emitted for them is processed there before anything the gaining one emits.
    Named apart from ``marker``: no PE aligns on it, it is only noted as taken."""
    return f"{marker}/exported"


def least_progress(progresses: list[tuple]) -> tuple:
    """Chain progress ``(in_wm, wm, open_inputs, ended)`` no further than any of ``progresses``:
    where instances' state is merged, no instance fires a window another had not."""
    in_wm: dict[str, int] = {}
    for p in progresses:
        for u, w in p[0].items():
            in_wm[u] = min(w, in_wm.get(u, w))
    return (in_wm, min(p[1] for p in progresses), set().union(*(p[2] for p in progresses)),
            all(p[3] for p in progresses))
