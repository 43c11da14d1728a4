"""The CheckpointCoordinator: trigger, acknowledge, store, complete (or abort) checkpoints.

Shaped as Flink's: a checkpoint is *pending* from its trigger until every PE
answered that its snapshot is taken; then each worker writes its PEs' state
files straight to the storage (``worker/ckpt_files.py``: the deploying process
never holds state bytes) and answers their entries, the manifest listing them
is written last (storage.py), and only then are the sinks told to commit; a checkpoint
that errs or passes ``pescheduler.checkpoint.timeout`` is aborted (sinks
discard its staging, PEs still aligning on it go on) and the next one is
tried at the next interval. The write is bounded by the timeout without
progress: while the workers' writers put bytes it goes on however long it
takes (a whole state of 10^7 keys: tens of seconds); once none has for the
timeout (a hung storage, a stopped worker), it is aborted. It holds the :class:`~pescheduler.control.reconfigurer.Reconfigurer`'s
lock from the trigger to the last PE's snapshot, so a checkpoint and a
reconfiguration never interleave: a barrier never crosses a half-rewired
graph. Writing the snapshots to storage comes after the lock is released and
is bounded by the timeout: a recovery never waits behind a hung storage.

A checkpoint is aborted as soon as one worker's answer says it cannot
complete (a PE gone or erred, a call refused), and at once when a recovery
begins (:meth:`CheckpointCoordinator.interrupt`): PEs downstream of a killed
worker never see its barrier, and waiting for them until the timeout held
the lock the restore needs (bench/recovery.py saw a 33 s restart).

The PE side (alignment, snapshot, forwarding the barrier) is ``worker/barriers.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, NamedTuple

from ..errors import CheckpointError
from .restore import placement_blob
from .storage import CheckpointStore

if TYPE_CHECKING:
    from ..plan.placement import Placement
    from .ports import CheckpointCalls, Layout, Lifecycle

logger = logging.getLogger(__name__)

RECENT = 20       # complete checkpoints listed in the status (the dashboard draws each one's duration and size)
PROGRESS_POLL_S = 1.0   # a write's progress is asked of its workers this often (at most a quarter of the timeout)


class InFlight:
    """The checkpoint being taken, as the status shows it (``checkpoints.in_flight``): its id, since
    when, its phase, the workers it waits for, the bytes they wrote so far and how long since it
    last moved. A whole-state checkpoint of 10^7 keys takes tens of seconds (docs/state.md,
    "Limits, and what is next"); the status said only what completed, so a long one and a hung
    one looked alike until the timeout.

    Phases, in order: ``snapshots`` (barriers in, each worker's PEs' snapshots awaited), ``writing``
    (each worker writing its PEs' files to the storage), ``manifest`` (this process writing the
    manifest). Once the manifest is written the checkpoint is complete and no longer in flight;
    its sinks' commit comes after, outside ``_one_at_a_time``, as the next one may begin.

    It *moves* when it enters a phase, when a worker answers, and when a worker's count of bytes
    written grows (:meth:`wrote`): the write's watchdog aborts it once it has not moved for the
    timeout (:meth:`CheckpointCoordinator._watched`)."""

    def __init__(self, checkpoint_id: int, started: float) -> None:
        self.id, self.started = checkpoint_id, started
        self.phase, self.waiting_for = "snapshots", set()
        self.written: dict[str, int] = {}       # worker -> bytes it wrote of this checkpoint so far
        self.answers: dict[str, str] = {}       # worker -> what it said when last asked (an abort names it)
        self.moved_at = time.monotonic()

    def enter(self, phase: str, workers: Iterable[str] = ()) -> None:
        self.phase, self.waiting_for = phase, set(workers)
        self.moved_at = time.monotonic()

    async def awaiting(self, worker: str, call, *args):
        """``call(*args)`` (one worker's) awaited; the worker is no longer waited for once it
        answers. The call is made here, not given made: a wrapper cancelled before it starts then
        leaves no call made and never awaited (:func:`_first_failure`)."""
        try:
            return await call(*args)
        finally:
            self.waiting_for.discard(worker)
            self.moved_at = time.monotonic()

    def wrote(self, worker: str, written: int | None) -> None:
        """``worker`` says it has written ``written`` bytes so far (None: no write going on there)."""
        self.answers[worker] = "no write of it going on there" if written is None else f"{written} bytes"
        if written is not None and written > self.written.get(worker, 0):
            self.written[worker] = written
            self.moved_at = time.monotonic()

    def idle_s(self) -> float:
        return max(0.0, time.monotonic() - self.moved_at)

    def as_dict(self) -> dict:
        return {"id": self.id, "phase": self.phase, "age_s": round(max(0.0, time.time() - self.started), 3),
                "waiting_for": sorted(self.waiting_for), "bytes": sum(self.written.values()),
                "idle_s": round(self.idle_s(), 3)}


class Stored(NamedTuple):
    """A checkpoint's sizes once its manifest is written: ``bytes`` of the files it wrote (the
    manifest records them; its own size, ``manifest_bytes``, cannot be in it), ``state_bytes``
    referenced, and each PE's part (:attr:`CompletedCheckpoint.pes`: not in the manifest, whose
    placement is written again only when it changes)."""

    bytes: int
    state_bytes: int
    manifest_bytes: int
    pes: dict


@dataclass(frozen=True)
class CompletedCheckpoint:
    """One complete checkpoint, as ``Deployment.checkpoints()`` lists it."""

    id: int
    time: float            # unix time of the trigger
    duration_s: float      # trigger to commit
    bytes: int             # bytes this checkpoint wrote, its manifest included
    url: str               # where its directory is
    state_bytes: int = 0   # bytes of every file it references (earlier checkpoints' unchanged key groups too)
    manifest_bytes: int = 0    # of those ``bytes``, its manifest's (what changed since the previous one's)
    # each PE's part: {pe: {"operators", "bytes" (its files this checkpoint wrote), "state_bytes"}}:
    # where the state is, by the writers' own figures (nothing is read or counted again for it)
    pes: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class CheckpointCoordinator:
    """Takes a deployment's checkpoints, on a timer (:meth:`run`) or on demand (:meth:`trigger`)."""

    def __init__(self, gateway: "CheckpointCalls", reconfigurer: "Layout", state: "Lifecycle",
                 store: CheckpointStore, *, interval: float, timeout: float, retain: int,
                 first_id: int = 1) -> None:
        self.gateway = gateway
        self.reconfigurer = reconfigurer
        self.state = state
        self.store = store
        self.interval = interval
        self.timeout = timeout
        self.retain = retain
        self.next_id = first_id
        self.completed: list[CompletedCheckpoint] = []
        self.completed_count = 0     # every one since the start (``completed`` keeps the newest)
        self.aborted = 0
        self.last_error: str | None = None
        self.paused = False          # set while a recovery restores (control/recovery.py)
        self._calling: asyncio.Task | None = None        # the call to workers in flight (interrupt cancels it)
        self._interrupted: str | None = None             # why the checkpoint in flight was interrupted
        self._one_at_a_time = asyncio.Lock()             # checkpoints are taken and written in id order
        self._writing: asyncio.Future | None = None      # the manifest's write thread (close() waits for it)
        self._written_by: tuple[int, float, float] | None = None   # that write's checkpoint id, t0, p0
        self.in_flight: InFlight | None = None           # the checkpoint being taken (the status's)

    def interrupt(self, reason: str) -> None:
        """A recovery begins: no checkpoint starts until it ends (:attr:`paused`), and the one in
        flight stops calling workers now (its PEs are about to be stopped, one worker is dead and
        a call to it would wait out its bound) rather than at its timeout: aborted, or complete
        without its commit sent if its manifest is written (the restore commits it)."""
        self.paused = True
        self._interrupted = reason
        if self._calling is not None and not self._calling.done():
            self._calling.cancel()

    async def _call(self, coro):
        """Await ``coro`` (calls to workers) so that :meth:`interrupt` can cut it short; then
        :class:`CheckpointError`."""
        if self._interrupted is not None:
            coro.close()
            raise CheckpointError(f"interrupted: {self._interrupted}")
        self._calling = asyncio.ensure_future(coro)
        try:
            return await self._calling
        except asyncio.CancelledError:
            if self._interrupted is None:
                raise                            # our own caller is cancelled
            raise CheckpointError(f"interrupted: {self._interrupted}") from None
        finally:
            self._calling = None

    async def run(self, done: asyncio.Event) -> None:
        """Every ``interval`` until ``done``: one checkpoint (an abort is logged; the next goes on)."""
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
            if done.is_set():
                return
            try:
                await self.trigger()
            except CheckpointError:
                pass                  # recorded in events and last_error
            except Exception as exc:  # a bug or an unexpected storage error: said, and the next one goes on
                logger.error("checkpoint failed", exc_info=True)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.state.event("checkpoint", f"checkpoint failed: {self.last_error}")

    async def close(self) -> None:
        """The deployment ends. Its tasks are cancelled, possibly while a manifest is being
        written in its thread (which goes on: a cancelled await does not stop a thread) and before
        the old checkpoints were pruned: wait for that write, then prune once more, both bounded
        by the timeout, so a run leaves no more than ``retain`` checkpoints. A manifest written
        this way is complete; the restore that uses it commits its sinks' output."""
        if self._writing is not None and not self._writing.done():
            await asyncio.wait([self._writing], timeout=self.timeout)
        try:
            await asyncio.wait_for(asyncio.to_thread(self._last_prune), self.timeout)
        except asyncio.TimeoutError:
            logger.warning("pruning old checkpoints at the end took longer than %g s; left", self.timeout)

    def _last_prune(self) -> None:
        """A manifest written after the end cut its checkpoint's completion short makes it complete
        (and the newest): it is listed before the prune keeps it and removes the one before, which
        the history would otherwise name as the last while its manifest is gone (seen loaded)."""
        pending, listed = self._written_by, {c.id for c in self.completed}
        if (pending is not None and pending[0] not in listed and self._writing is not None
                and self._writing.done() and not self._writing.cancelled() and self._writing.exception() is None
                and pending[0] in self.store.completed()):
            self._listed(*pending, self._writing.result())
        self.store.prune(self.retain)

    def _listed(self, checkpoint_id: int, t0: float, p0: float, stored: Stored) -> CompletedCheckpoint:
        """A complete checkpoint into the (bounded) history that status and ``checkpoints()`` show."""
        done = CompletedCheckpoint(checkpoint_id, t0, time.perf_counter() - p0, stored.bytes + stored.manifest_bytes,
                                   f"{self.store.url}/chk-{checkpoint_id:06d}", stored.state_bytes,
                                   stored.manifest_bytes, stored.pes)
        self.completed.append(done)
        self.completed_count += 1
        del self.completed[:-max(self.retain, 1) * 10]
        return done

    async def trigger(self) -> int:
        """Take one checkpoint now; its id once complete. Raises :class:`CheckpointError` if it is
        aborted (a PE failed or erred, the timeout passed) or cannot start.

        The Reconfigurer's lock is held from the barriers to the last snapshot only: writing to
        storage (bounded by the timeout too) happens after it is released, so a reconfiguration
        or a recovery never waits behind a slow or hung storage. Checkpoints are taken one at a
        time (a second trigger waits without holding the Reconfigurer's lock)."""
        async with self._one_at_a_time, self._flying():
            async with self.reconfigurer.lock.held(f"checkpoint {self.next_id}"):
                if not self.state.live or self.paused:
                    raise CheckpointError(f"no checkpoint while the deployment is "
                                          f"{'recovering' if self.paused else self.state.state}")
                checkpoint_id, self.next_id = self.next_id, self.next_id + 1
                placement = self.reconfigurer.placement
                workers = sorted({pe.worker for pe in placement.pes.values()})
                t0, p0 = time.time(), time.perf_counter()
                self._interrupted = None
                self.in_flight = InFlight(checkpoint_id, t0)
                try:
                    results = await self._call(self._collect(checkpoint_id, placement, self.reconfigurer.epoch))
                    if not self.state.live:     # a drain began meanwhile: sources may have ended early
                        raise CheckpointError(f"the deployment is {self.state.state}")
                except Exception as exc:
                    await self._abort(checkpoint_id, workers, exc)
                    raise CheckpointError(f"checkpoint {checkpoint_id} aborted: {exc}") from exc
            try:
                async with self.reconfigurer.writing():     # a pause waits for it (Reconfigurer.writing)
                    stored = await self._write(checkpoint_id, placement, t0, p0)
            except Exception as exc:
                await self._abort(checkpoint_id, workers, exc)
                raise CheckpointError(f"checkpoint {checkpoint_id} aborted: {exc}") from exc
        return await self._complete(checkpoint_id, t0, p0, stored)

    @contextlib.asynccontextmanager
    async def _flying(self):
        """:attr:`in_flight` is None again when a checkpoint's turn ends: its manifest written,
        aborted, or cancelled (the deployment ends). Inside ``_one_at_a_time``: a trigger still
        waiting for its turn leaves the one in flight alone."""
        try:
            yield
        finally:
            self.in_flight = None

    async def _write(self, checkpoint_id: int, placement: "Placement", t0: float, p0: float) -> Stored:
        """The workers write their PEs' files straight to the storage, then the manifest listing
        them is written here in a thread; bounded by the timeout without progress
        (:meth:`_watched`): past it the thread is told to give up (it writes no manifest after
        that) and the checkpoint is aborted."""
        abandoned, flight = threading.Event(), self._flight(checkpoint_id, t0)
        writing = asyncio.ensure_future(self._write_all(checkpoint_id, placement, t0, p0, abandoned, flight))
        try:
            return await self._watched(writing, flight, abandoned)
        finally:
            if not writing.done():
                writing.cancel()
                await asyncio.gather(writing, return_exceptions=True)

    async def _watched(self, writing: asyncio.Future, flight: InFlight, abandoned: threading.Event):
        """``writing``'s result, unless the checkpoint stops moving (:class:`InFlight`) for the
        timeout: while writing, each worker still writing is asked how many bytes it has put
        (``ckpt_progress``, every :data:`PROGRESS_POLL_S` or a quarter of the timeout); a count that
        grew moves it. So a whole state that takes longer than the timeout to write is written
        (a first checkpoint at 10^7 keys took 27-35 s against the 30 s default and was aborted,
        then written again by a second attempt), and a write that stopped (a hung storage, a
        stopped worker) is given up the timeout after its last byte. The manifest's write, one put
        here, is bounded by the timeout from its start."""
        poll = min(PROGRESS_POLL_S, self.timeout / 4)
        while True:
            done, _ = await asyncio.wait([writing], timeout=poll)
            if done:
                return writing.result()
            if flight.phase == "writing" and flight.waiting_for:
                await self._ask_progress(flight, max(poll, self.timeout - flight.idle_s()))
            if flight.idle_s() >= self.timeout and not writing.done():
                abandoned.set()
                if flight.phase == "manifest":
                    raise CheckpointError(f"writing its manifest to {self.store.url} took longer than "
                                          f"{self.timeout:g} s")
                waits = ", ".join(f"{w} ({flight.answers.get(w, 'not asked yet')})" for w in sorted(flight.waiting_for))
                raise CheckpointError(f"no progress writing it to {self.store.url} for {self.timeout:g} s "
                                      f"({sum(flight.written.values())} bytes written as last asked, "
                                      f"{time.time() - flight.started:.1f} s after its trigger; waiting for {waits})")

    async def _ask_progress(self, flight: InFlight, within: float) -> None:
        """Each worker still writing asked its bytes written, for at most ``within`` s (until the
        watchdog's deadline: a stopped worker's call would otherwise hold it ``calls.worker``); one
        that does not answer in time, or fails, has not moved."""
        asks = {asyncio.ensure_future(self.gateway.ckpt_progress(w, flight.id)): w for w in sorted(flight.waiting_for)}
        done, pending = await asyncio.wait(asks, timeout=within)
        for ask in pending:
            ask.cancel()
            flight.answers[asks[ask]] = f"no answer in {within:.2f} s"
        await asyncio.gather(*pending, return_exceptions=True)
        for ask in done:
            if ask.exception() is None:
                flight.wrote(asks[ask], ask.result())
            else:
                flight.answers[asks[ask]] = f"the question failed: {ask.exception()!r}"

    async def _write_all(self, checkpoint_id: int, placement: "Placement", t0: float, p0: float,
                         abandoned: threading.Event, flight: InFlight) -> Stored:
        """The workers' writes, then the manifest's; ``flight`` is the one :meth:`_watched` watches."""
        by_worker: dict[str, list[str]] = {}
        for pe_id, pe in placement.pes.items():
            by_worker.setdefault(pe.worker, []).append(pe_id)
        flight.enter("writing", by_worker)
        answers = await self._call(_first_failure(
            flight.awaiting(w, self.gateway.ckpt_write, w, checkpoint_id, pes, self.store.url)
            for w, pes in by_worker.items()))
        results: dict[str, dict] = {}
        for answer in answers:
            results.update(answer)
        errors = [r["error"] for r in results.values() if "error" in r]
        if errors:
            raise CheckpointError(errors[0])
        self._written_by = (checkpoint_id, t0, p0)
        flight.enter("manifest")
        self._writing = asyncio.get_running_loop().run_in_executor(None, functools.partial(
            self._store, checkpoint_id, results, placement, t0, time.perf_counter() - p0, abandoned))
        return await asyncio.shield(self._writing)   # a cancelled caller leaves it to close()

    async def _complete(self, checkpoint_id: int, t0: float, p0: float, stored: Stored) -> int:
        """The manifest is written: sinks commit (under the lock again: between reconfigurations,
        on the workers of the placement as it is now), the history and events say so, old ones go."""
        async with self.reconfigurer.lock.held(f"checkpoint {checkpoint_id}'s completion"):
            workers = sorted({pe.worker for pe in self.reconfigurer.placement.pes.values()})
            try:
                await self._call(self.gateway.ckpt_end(workers, checkpoint_id, complete=True))
            except CheckpointError:
                pass                    # complete: the restore that interrupted commits it
        done = self._listed(checkpoint_id, t0, p0, stored)
        await asyncio.to_thread(self.store.prune, self.retain)   # failures logged, retried next time
        self.state.event("checkpoint", f"checkpoint {checkpoint_id} complete: {done.bytes} bytes written "
                                       f"({done.state_bytes} referenced) in {done.duration_s * 1000:.0f} ms")
        return checkpoint_id

    async def _collect(self, checkpoint_id: int, placement: "Placement", epoch: int) -> dict[str, dict]:
        """Barriers in at the source PEs; every PE's snapshot out (``pe_id -> result``). The first
        worker whose answer says the checkpoint cannot complete aborts it at once."""
        by_worker: dict[str, list[str]] = {}
        for pe_id, pe in placement.pes.items():
            by_worker.setdefault(pe.worker, []).append(pe_id)
        with_sources = {pe_id for pe_id, pe in placement.pes.items()
                        if any(placement.plan.ops[op].kind == "source" for op in pe.operators)}
        flight = self._flight(checkpoint_id, time.time())
        flight.enter("snapshots", by_worker)
        await _first_failure(self.gateway.ckpt_begin(w, checkpoint_id, [p for p in pes if p in with_sources], epoch)
                             for w, pes in by_worker.items())
        answers = await _first_failure(flight.awaiting(w, self._snapshots, w, checkpoint_id, pes)
                                       for w, pes in by_worker.items())
        results: dict[str, dict] = {}
        for answer in answers:
            results.update(answer)
        missing = [p for p in placement.pes if p not in results]
        if missing:
            raise CheckpointError(f"no snapshot from PE {', '.join(missing)} within {self.timeout:g} s")
        return results

    def _flight(self, checkpoint_id: int, started: float) -> InFlight:
        """The status's checkpoint in flight (one of its own when a phase is called alone)."""
        flight = self.in_flight
        return flight if flight is not None and flight.id == checkpoint_id else InFlight(checkpoint_id, started)

    async def _snapshots(self, worker: str, checkpoint_id: int, pe_ids: list[str]) -> dict[str, dict]:
        """One worker's snapshots of ``checkpoint_id``; raises on the first PE that erred or is gone."""
        answer = await asyncio.wait_for(self.gateway.ckpt_wait(worker, checkpoint_id, pe_ids, self.timeout),
                                        self.timeout + self.gateway.worker_timeout)
        errors = [r["error"] for r in answer["results"].values() if "error" in r]
        if errors:
            raise CheckpointError(errors[0])
        return answer["results"]

    def _store(self, checkpoint_id: int, results: dict[str, dict], placement: "Placement", t0: float,
               took: float, abandoned: threading.Event) -> Stored:
        """The placement (synced), then the manifest listing it and the files the workers wrote
        (in a thread: off the control loop), with each PE's bytes written and referenced. Nothing
        more is written once ``abandoned`` is set."""
        files, positions, pes = [], {}, {}

        def written(entries: list[dict]) -> int:    # by this checkpoint, not held in the manifest
            return sum(f["bytes"] for f in entries if f["chk"] == checkpoint_id and "data" not in f)

        for pe_id, result in sorted(results.items()):
            state, *groups = result["files"]
            operators = list(placement.pes[pe_id].operators)
            files += [{**state, "operators": operators}, *groups]
            positions.update(result["positions"])
            pes[pe_id] = {"operators": operators, "bytes": written(result["files"]),
                          "state_bytes": result.get("state_bytes", sum(f["bytes"] for f in result["files"]
                                                                       if f["role"] != "map"))}
        _go_on(abandoned)
        files.append({**self.store.put(checkpoint_id, "placement.pkl", placement_blob(placement), reuse=True),
                      "role": "placement"})
        size, state_size = written(files), sum(p["state_bytes"] for p in pes.values())
        _go_on(abandoned)
        manifest_size = self.store.commit_manifest(checkpoint_id, {
            "id": checkpoint_id, "deployment": self.reconfigurer.deployment, "time": t0,
            "duration_s": round(took, 6), "bytes": size, "state_bytes": state_size, "files": files,
            "positions": positions,
            "placement": {pe_id: {"worker": pe.worker, "operators": list(pe.operators)}
                          for pe_id, pe in placement.pes.items()}})
        if abandoned.is_set():          # given up while the manifest was written: not complete after all
            self.store.withdraw(checkpoint_id)
        return Stored(size, state_size, manifest_size, pes)

    async def _abort(self, checkpoint_id: int, workers: list[str], exc: BaseException) -> None:
        self.aborted += 1
        self.last_error = f"checkpoint {checkpoint_id}: {type(exc).__name__}: {exc}"
        self.state.event("checkpoint", f"checkpoint {checkpoint_id} aborted: {exc}")
        try:                         # PEs still aligning on it go on (not when a restore stops them)
            await self._call(self.gateway.ckpt_end(workers, checkpoint_id, complete=False))
        except CheckpointError:
            pass
        # Its files stay: the key groups a worker wrote whole before the abort are what its next
        # attempt builds on (state/incremental.py); with no manifest nothing restores them, and
        # pruning removes them once a complete checkpoint after it references none of them.

    def last_pes(self) -> dict[str, dict]:
        """Each PE's part of the last complete checkpoint (:attr:`CompletedCheckpoint.pes`), or {}."""
        return self.completed[-1].pes if self.completed else {}

    def view(self) -> dict:
        """The checkpoint part of the status."""
        last = self.completed[-1].as_dict() if self.completed else None
        if last is not None:          # since it completed, as of this status (the views show it)
            last["age_s"] = round(max(0.0, time.time() - last["time"] - last["duration_s"]), 3)
        origin = self.store.origin
        return {"storage": self.store.url, "run": self.store.run,
                "restored_from": f"{origin[0]}/{origin[1]}" if origin else None,
                "interval_s": self.interval, "completed": self.completed_count,
                "aborted": self.aborted, "last": last, "last_error": self.last_error,
                "in_flight": self.in_flight.as_dict() if self.in_flight is not None else None,
                "prune_error": self.store.prune_error,
                "recent": [{k: v for k, v in c.as_dict().items() if k != "pes"} for c in self.completed[-RECENT:]]}


def _go_on(abandoned: threading.Event) -> None:
    if abandoned.is_set():
        raise CheckpointError("given up: the write made no progress within pescheduler.checkpoint.timeout")


async def _first_failure(calls: Iterable) -> list:
    """Every call's answer; on the first that raises, the others are cancelled (and awaited:
    none is left running) and that exception is raised. ``calls`` is a generator: the calls are
    made only once this runs, so one closed or cancelled before it started (an interrupted
    checkpoint, :meth:`CheckpointCoordinator._call`) leaves no call made and never awaited."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    if not tasks:
        return []
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        return [t.result() for t in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
