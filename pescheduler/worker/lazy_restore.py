"""A restored PE starts at once; its key groups load on first touch and in the background.

Before, a PE restored from a checkpoint was built only once every key group of
every KEYED operator in it had been read, checked and unpickled
(``resolve_restore``), and then written into its store: the PE's first tuple
waited for all of it, and that time grew with the keys (at 10^6 keys the
unpickle alone was 4.2 s of 4.6 s, loaded; at 10^7 the first output came
88 s after a SIGKILL). Flink's and Megaphone's answer, here on the gate a
rescale's move already uses (``pending_groups.py``):

* the operator is restored from its saved state with no key group in it
  (``split_state``: what is not keyed, its progress, its source position),
  and every key group it had is gated: a tuple of a group not loaded yet
  waits in the gate, in arrival order, never sees empty state;
* a loader (:class:`Loader`, one task per PE) reads the groups one at a time:
  the group most tuples wait for first (first touch), then the rest in order.
  Reading, checking (SHA-256), unpickling a group and making it ready for
  the store run in a worker thread (the backend's ``prepare_group``: on
  ``disk`` every key encoded, every value pickled, an SST file written; on
  ``memory`` the unpickled dict, which nobody else holds). Only its install
  runs in the PE's turn (``import_groups``, the operator's own: an SST
  ingest, or a dict made the group's and the index updated), and right
  after it the group's waiting tuples go through, before anything that
  arrives later: per-key order and exactly once as for a moved group. The
  turn once encoded and pickled the group itself on ``disk``: 214-459 ms for
  a group of 78,000 keys (10^7 keys), a stall of the stream per group;
* while groups are pending the operator's watermark stays back (the gate's
  hold), so no window fires without all its keys;
* a checkpoint in that time completes (:meth:`Loader.with_unloaded`) unless a
  tuple waits at the gate (taken before the barrier, in no state and no file:
  that checkpoint is declined, ``PERunner.snapshot``); the
  groups not loaded yet are unchanged since the restored checkpoint, so the
  operator's snapshot is merged (its own ``merge_states``) with their part of
  the saved state, whose key groups are still :class:`GroupRef` entries; the
  worker's writer references those files in the new checkpoint
  (``incremental.ChainWriter``), the signed manifest lists them and retention
  keeps them while a kept checkpoint does. Flink's checkpoints go on after a
  recovery the same way (the restored SST files stay shared);
* a rescale's snapshot or export of it is refused (:func:`still_loading`,
  :class:`StillLoading`: it would move state the instance does not hold); the
  controller refuses such an action before its pause, with the groups still
  loading in the reason (``control/reconfigurer.py``), from the PE's figures
  (:func:`restoring`), so a policy tries again later.

Both backends take this one path: it is the operators' ``split_state`` and
``import_groups``, whatever holds their keys. An operator without
``import_groups``, or keyed only by its own parameters (a join's ``on=`` with no
``key_by``: no key the gate could read), is restored whole, as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from typing import Any, Callable

from ..operator import Operator
from ..state.incremental import ref_groups, resolve_part
from ..state.local import LocalCopies
from ..state.settings import backend_name, cache_bytes, deployment_dir
from ..wire import PESpec, key_group
from .gc_pause import gc_held
from .pending_groups import PendingGroups
from ..collector import freeze_survivors
from .routing import key_function

logger = logging.getLogger(__name__)

RESTORING = "(restore)"         # the gate's tag: key groups of a checkpoint, loading here


class StillLoading(RuntimeError):
    """A snapshot or export of an instance whose restored key groups are not all loaded yet."""


def lazily(cls: type) -> bool:
    """Can an instance of ``cls`` start before its key groups are in? It imports groups into a
    running instance (``import_groups``); the gate holds its tuples until they are
    (``pending_groups.py``: rows, an Arrow batch as its rows, per input for a join)."""
    return callable(getattr(cls, "import_groups", None))


SLOW_IMPORT_S = 0.020   # an import turn longer than this is a stall of the stream (the figures count them)


def preparer(pe: Any) -> Callable[[int, dict], Any]:
    """The ``prepare_group`` of ``pe``'s keyed-state backend (a lazy restore's groups, a rescale's
    parts: ``worker/handover.py``), its files beside the deployment's stores."""
    if backend_name(pe.hosting.state_backend) == "disk":
        from ..state.disk import prepare_group

        where = os.path.join(deployment_dir(pe.spec.deployment), "prepared")   # beside the stores
        return functools.partial(prepare_group, where=where, cache_bytes=cache_bytes())
    from ..state.memory import prepare_group

    return prepare_group


class Pending:
    """One operator's saved state whose key groups are still in their files."""

    def __init__(self, op_id: str, splitter: Operator, state: Any, storage: str, groups: list[int]) -> None:
        self.op_id, self.splitter, self.state, self.storage = op_id, splitter, state, storage
        self.groups = groups
        self.prepare: Callable[[int, dict], Any] | None = None     # the backend's (the Loader sets it)
        self.packs: dict = {}       # the small-delta packs read so far: several groups' chains name each
        self.files = [0, 0, 0]      # files named so far, read from this worker's copies (local recovery), from the storage

    def read(self, group: int, local: LocalCopies | None) -> Any:
        """Group ``group``'s part of the saved state, read, checked, unpickled and made ready for
        the store (``prepare``) here, in a worker thread."""
        part = self.splitter.split_state(self.state, lambda key: key_group(key) == group)
        return gc_held(resolve_part, part, self.storage, local, self.prepare, self.packs, self.files)


def defer(spec: PESpec) -> dict[str, Pending]:
    """In place: each KEYED operator of ``spec.restore`` that can start without its key groups
    (:func:`lazily`) keeps only its state that is not in the key groups its files hold (a group
    already in bytes stays, restored at once); what it is waiting for is returned, op id ->
    :class:`Pending`. The other operators' entries are left to ``resolve_restore``."""
    out = {}
    for op_id, saved in spec.restore.items():
        storage = saved.get("storage")
        cls, params, key = spec.ops[op_id]
        # the gate reads a tuple's key group by the key its edges are routed by: a join keyed only
        # by its own ``on=`` (no key_by) names none, and restores at once
        if storage is None or "handover" in saved or key is None or not lazily(cls):
            continue
        groups = sorted(ref_groups(saved["state"]))
        if not groups:
            continue
        splitter, full, later = cls(**params), saved["state"], frozenset(groups)
        saved["state"] = splitter.split_state(full, lambda key: key_group(key) not in later)
        out[op_id] = Pending(op_id, splitter, full, storage, groups)
    return out


def still_loading(pe: Any) -> list[str]:
    """The operators of ``pe`` whose restored key groups are not all loaded yet."""
    return [op_id for op_id, g in pe.rewirer.pending.items() if g.tag == RESTORING and not g.done]


def restoring(pe: Any) -> dict | None:
    """``{"groups", "loaded", "s"}`` of ``pe``'s restored key groups while some still load (its
    figures: the controller holds rescales of it back until they are in), else None."""
    loader = pe.loader
    if loader is None or not still_loading(pe):
        return None
    total = sum(g.total for g in loader.gates.values())
    return {"groups": total, "loaded": loader.loaded, "s": round(time.perf_counter() - loader.t0, 3)}


class Loader:
    """Loads a restored PE's pending key groups, one at a time, waited-for groups first."""

    def __init__(self, pe: Any, pending: dict[str, Pending], local: LocalCopies | None) -> None:
        self.pe, self.pending, self.local = pe, pending, local
        self.gates: dict[str, PendingGroups] = {}
        self.task: asyncio.Task | None = None
        self.loaded = 0                 # groups imported so far (figures, tests)
        self.t0 = time.perf_counter()
        self.slow_imports = 0           # imports whose turn took over SLOW_IMPORT_S
        for p in pending.values():
            p.prepare = preparer(pe)

    @property
    def longest_import_s(self) -> float:
        """The longest import in the PE's turn (a stall of its stream), of any of its gates."""
        return max((g.longest_import_s for g in self.gates.values()), default=0.0)

    def gate(self) -> None:
        """Gate every pending group (the PE's chain is built, it has taken no tuple yet)."""
        pe = self.pe
        pe.loader = self
        for op_id, p in self.pending.items():
            self.gates[op_id] = pe.rewirer.pending[op_id] = PendingGroups(
                pe.chain, op_id, p.groups, key_function(pe.spec.ops[op_id][2]), RESTORING)

    def start(self) -> asyncio.Task:
        self.task = asyncio.create_task(self.run(), name=f"restore of {self.pe.pe_id}")
        return self.task

    def next(self) -> tuple[str, int] | None:
        """The next group to load: the one most tuples wait for, else the lowest pending one."""
        first = None
        for op_id, gate in self.gates.items():
            wanted = gate.waited_for()
            if wanted:
                return op_id, wanted[0]
            if first is None and gate.waiting:
                first = (op_id, next(iter(gate.waiting)))
        return first

    def with_unloaded(self, op_id: str, state: Any) -> Any:
        """``state`` (operator ``op_id``'s snapshot now, without the groups not loaded yet) merged
        with those groups' part of the restored state: a checkpoint taken while they load. Their
        key groups stay :class:`GroupRef` entries (``merge_groups`` joins them to the view: the
        writer references their files, nothing is read or packed here, in the PE's turn)."""
        p, left = self.pending[op_id], frozenset(self.gates[op_id].waiting)
        unloaded = p.splitter.split_state(p.state, lambda key: key_group(key) in left)
        return p.splitter.merge_states([state, unloaded])

    async def run(self) -> None:
        """Every pending group, one :meth:`load_one` after another, while the PE runs; a group that
        cannot be read fails the PE (a file damaged since the deploying process checked it), which
        is then restored again like any failed PE."""
        pe, self.t0 = self.pe, time.perf_counter()
        try:
            while await self.load_one():
                pass
            here, there = pe.restored_files = tuple(sum(p.files[i] for p in self.pending.values()) for i in (1, 2))
            logger.info("PE %s: %d restored key groups loaded %.3f s after its start, %d files read from this "
                        "worker's copies and %d from the storage (longest import in its turn %.1f ms, %d over "
                        "%.0f ms)", pe.pe_id, self.loaded, time.perf_counter() - self.t0, here, there,
                        self.longest_import_s * 1000, self.slow_imports, SLOW_IMPORT_S * 1000)
            pe.loader = None
        except Exception as exc:
            logger.error("PE %s: loading its restored key groups failed", pe.pe_id, exc_info=True)
            pe.barriers.failure = exc   # raised at the PE's next turn (barriers.Barriers.check)
            pe.ports.wake()

    async def load_one(self) -> bool:
        """Read the next group (:meth:`next`) in a thread, import it between two of the PE's turns
        and let its waiting tuples through in that turn; False when none is left or the PE stopped."""
        pe = self.pe
        picked = self.next()
        if picked is None or pe.state not in ("created", "running"):
            return False
        op_id, g = picked
        part = await asyncio.to_thread(self.pending[op_id].read, g, self.local)
        async with pe.turns.lock:
            if pe.state not in ("created", "running"):
                return False
            took = self.gates[op_id].install([g], lambda: pe.ops[op_id].import_groups(part))
            freeze_survivors()
            self.slow_imports += took > SLOW_IMPORT_S
        self.loaded += 1
        pe.ports.wake()
        return True
