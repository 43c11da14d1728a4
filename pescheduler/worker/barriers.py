"""One PE's side of a checkpoint: align on the barrier, snapshot, forward it, hand the bytes over.

A checkpoint barrier is a marker (``("checkpoint", id, epoch)``) that travels
in-band like a reconfiguration marker (aligner.py). The coordinator
(``pescheduler/checkpoint/coordinator.py``) starts it at every PE that holds a
source; every other PE starts aligning when the barrier first arrives on one
of its inputs. While a PE aligns, its sources read nothing and the channels
that delivered the barrier are parked (what they carry belongs to the next
checkpoint), so each operator's snapshot holds exactly the input before the
barrier. Once every operator of the PE is aligned:

1. sinks (and sources with commit hooks) get ``pre_commit(id)``, then every operator's ``snapshot()``, the
   chain's watermark progress and each source's ``position()`` are taken and
   pickled right there: the state is copied before the PE changes it again
   (the synchronous part, as Flink's);
2. parked input goes back in front of the inbox and the sources read on;
3. the bytes wait in :attr:`Barriers.results` until the coordinator takes them
   (``pe_ckpt_wait``); writing them to storage happens in the deploying
   process, off every PE loop (the asynchronous part).

A barrier carries the Reconfigurer's epoch when its checkpoint began. A PE
ignores barriers of checkpoints it knows are over (taken or aborted here) and
barriers older than the PE itself (an epoch before its spec's): a PE created
by a reconfiguration or a restore never heard of the checkpoints aborted
before it, and a stale barrier of one (still queued in a channel that was
re-wired to it) would otherwise pause its sources and park the channel until
the next checkpoint's barrier came.

State is snapshotted per operator instance (one blob per operator, not per
key group): a KEYED operator's state is re-split by key group only when a
restore places its instances differently (``plan/state.py``'s ``redistribute``).
"""

from __future__ import annotations

from typing import Any, Callable

import cloudpickle

from ..errors import DeliveryFailed, NotReplayable
from ..operator import CommitHooks, Operator, Source
from .aligner import Aligner
from .ports import Ports
from .source_driver import Sources
from .turns import Turns

BARRIER = "checkpoint"


def barrier(checkpoint_id: int, epoch: int) -> tuple[str, int, int]:
    """The in-band marker of checkpoint ``checkpoint_id``, begun in ``epoch`` (msgpack keeps it a
    tuple: hashable)."""
    return (BARRIER, checkpoint_id, epoch)


def is_barrier(marker: Any) -> bool:
    return isinstance(marker, tuple) and len(marker) == 3 and marker[0] == BARRIER


class Barriers:
    """The checkpoints one PE takes part in: the one it aligns on, and results not yet taken.

    Its collaborators are the PE's parts it drives: the operators (commit hooks,
    source positions), the source drivers (paused while aligning), the aligner,
    the ports (outputs carry the barrier on; parked input goes back in front of
    the inbox), the turns (wake-ups from the PE's thread), ``snapshot`` (the
    operators' state, progress and source positions) and ``on_change`` (tell the
    PE host a result is there).
    """

    def __init__(self, pe_id: str, epoch: int, ops: dict[str, Operator], sources: Sources,
                 aligner: Aligner, ports: Ports, turns: Turns, snapshot: Callable[[], dict[str, dict]],
                 on_change: Callable[[], None]) -> None:
        self.pe_id, self.ops, self.sources = pe_id, ops, sources
        self.pe_epoch = epoch                   # the PE's own (its spec's): barriers begun before it are stale
        self.aligner, self.ports, self.turns, self.snapshot, self.on_change = aligner, ports, turns, snapshot, on_change
        self.current: int | None = None         # checkpoint being aligned on
        self.epoch = 0                          # the epoch its barrier carries
        self.done_upto = 0                      # barriers up to this id are taken or aborted here
        self.results: dict[int, dict] = {}      # id -> {"state": bytes, "positions": {...}} or {"error": str}
        self.failure: DeliveryFailed | None = None   # a sink's commit failed: the PE fails at its next turn

    def begin(self, checkpoint_id: int, epoch: int | None = None, moving: bool = True) -> bool:
        """Align on checkpoint ``checkpoint_id`` of ``epoch`` (the coordinator's trigger, or its
        barrier's first arrival; ``None``: the coordinator asks this PE itself, so it is current).
        ``moving``: the PE runs and its chain has not ended; else it snapshots as it is, now.
        True when the alignment began: the PE then checks it (``PERunner.check_aligned``)."""
        epoch = self.pe_epoch if epoch is None else epoch
        if self.stale(checkpoint_id, epoch) or self.current == checkpoint_id:
            return False
        if self.aligner.marker is not None and not is_barrier(self.aligner.marker):
            self.done_upto = checkpoint_id      # a reconfiguration aligns here: a late barrier of an
            return False                        # aborted checkpoint must not take its place
        if not moving:
            self._take(checkpoint_id)           # nothing moves here any more: its state as it is
            return False
        self.current, self.epoch = checkpoint_id, epoch
        self.sources.pause()
        self.aligner.begin(barrier(checkpoint_id, epoch), self._op_aligned)
        return True

    def arrived(self, channel, marker: tuple, moving: bool) -> bool:
        """A barrier arrived on ``channel``; False if it belongs to a checkpoint already over here
        (True: the PE checks its alignment)."""
        _, checkpoint_id, epoch = marker
        if self.stale(checkpoint_id, epoch):
            return False
        self.aligner.arrived(channel.channel_id, marker)
        self.begin(checkpoint_id, epoch, moving)
        return True

    def stale(self, checkpoint_id: int, epoch: int) -> bool:
        """A checkpoint over here (taken or aborted), or begun before this PE existed."""
        return checkpoint_id <= self.done_upto or epoch < self.pe_epoch

    def _op_aligned(self, op_id: str) -> None:
        """``op_id`` has the barrier on every input: its outputs carry it on (behind its data)."""
        for channel in self.ports.outputs_of(op_id):
            channel.marker(barrier(self.current, self.epoch))
        self.turns.on_loop(self.ports.wake)

    def aligned(self) -> None:
        """The whole PE is aligned: snapshot, then release parked input and the sources."""
        self._take(self.current)
        self._release()

    def _release(self) -> None:
        """End the alignment: parked input goes back in front of the inbox, sources read on."""
        self.ports.put_back(self.aligner.finish())
        self.current = None
        self.sources.pause(False)
        self.turns.on_loop(self.ports.wake)      # called in the PE's thread once it has one

    def _take(self, checkpoint_id: int) -> None:
        try:
            for op in self.ops.values():
                if isinstance(op, CommitHooks):
                    op.pre_commit(checkpoint_id)
            positions = {op_id: _position(op) for op_id, op in self.ops.items() if isinstance(op, Source)}
            state = cloudpickle.dumps(self.snapshot())
            self.results[checkpoint_id] = {"state": state, "positions": positions}
        except NotReplayable as exc:
            self.results[checkpoint_id] = {"error": str(exc)}
        except Exception as exc:
            self.results[checkpoint_id] = {"error": f"PE {self.pe_id}: snapshot failed: {type(exc).__name__}: {exc}"}
        self.done_upto = max(self.done_upto, checkpoint_id)
        self.turns.on_loop(self.on_change)

    def settle(self, checkpoint_id: int, complete: bool) -> None:
        """Checkpoint ``checkpoint_id`` is over: :meth:`commit` it if ``complete``, else :meth:`abort` it."""
        if complete:
            self.commit(checkpoint_id)
        else:
            self.abort(checkpoint_id)

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` failed: stop aligning on it.

        Sinks are *not* told to abort: nothing is replayed after a failed checkpoint that the
        run goes on from, so what they staged for it is committed with the next complete one
        (``commit(n)`` makes everything staged up to ``n`` visible, as Flink's two-phase-commit
        sinks do). ``abort`` is for a restore, which replays what came after (:meth:`restored`).
        """
        self.done_upto = max(self.done_upto, checkpoint_id)
        self.results.pop(checkpoint_id, None)
        if self.current == checkpoint_id:
            self._release()

    def restored(self, restore: dict[str, dict]) -> None:
        """Sinks restored from checkpoint N (``saved["checkpoint"]``) commit N (again: a crash may
        have come between the manifest and the commit; ``commit`` is idempotent), then abort N + 1:
        whatever was staged after N is discarded, because the sources replay it."""
        for op_id, saved in restore.items():
            op, done = self.ops[op_id], saved.get("checkpoint")
            if done is not None and isinstance(op, CommitHooks):
                op.commit(done)
                op.abort(done + 1)
            if done is not None:
                self.done_upto = max(self.done_upto, done)

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: sinks make its output visible (and a source with
        the hooks, ``postgres_cdc``, lets its slot drop what the checkpoint covers). A commit that
        fails (transient errors were retried by the sink) fails the PE, as Flink fails the task:
        a checkpointed run then restores this checkpoint, whose sinks commit it again, and a run
        that cannot restore fails loudly; the checkpoint never counts as published meanwhile."""
        for op_id, op in self.ops.items():
            if isinstance(op, CommitHooks):
                try:
                    op.commit(checkpoint_id)
                except Exception as exc:
                    self.failure = DeliveryFailed(f"PE {self.pe_id}: {op_id}: committing checkpoint "
                                                  f"{checkpoint_id} failed: {type(exc).__name__}: {exc}")
                    self.turns.on_loop(self.ports.wake)
                    raise self.failure from exc

    def check(self) -> None:
        """Raise the commit failure that fails this PE, if any (the PE's loop calls it)."""
        if self.failure is not None:
            raise self.failure


def _position(source: Source) -> Any:
    """The source's durable position (``None``: it keeps it only in its snapshot)."""
    try:
        return source.position()
    except NotImplementedError:
        return None
