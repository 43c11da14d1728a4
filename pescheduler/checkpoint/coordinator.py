"""The CheckpointCoordinator: trigger, acknowledge, store, complete (or abort) checkpoints.

Shaped as Flink's: a checkpoint is *pending* from its trigger until every PE
answered with its snapshot; then its state files are written, the manifest
last (storage.py), and only then are the sinks told to commit; a checkpoint
that errs or passes ``pescheduler.checkpoint.timeout`` is aborted (sinks
discard its staging, PEs still aligning on it go on) and the next one is
tried at the next interval. It holds the :class:`~pescheduler.control.reconfigurer.Reconfigurer`'s
lock from trigger to commit, so a checkpoint and a reconfiguration never
interleave: a barrier never crosses a half-rewired graph.

A checkpoint is aborted as soon as one worker's answer says it cannot
complete (a PE gone or erred, a call refused), and at once when a recovery
begins (:meth:`CheckpointCoordinator.interrupt`): PEs downstream of a killed
worker never see its barrier, and waiting for them until the timeout held
the lock the restore needs (bench/recovery.py saw a 33 s restart).

The PE side (alignment, snapshot, forwarding the barrier) is ``worker/barriers.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import cloudpickle

from ..errors import CheckpointError
from .storage import CheckpointStore

if TYPE_CHECKING:
    from ..plan.placement import Placement
    from .ports import CheckpointCalls, Layout, Lifecycle

logger = logging.getLogger(__name__)

RECENT = 20       # complete checkpoints listed in the status (the dashboard draws each one's duration and size)


@dataclass(frozen=True)
class CompletedCheckpoint:
    """One complete checkpoint, as ``Deployment.checkpoints()`` lists it."""

    id: int
    time: float            # unix time of the trigger
    duration_s: float      # trigger to commit
    bytes: int             # state stored
    url: str               # where its directory is

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

    async def trigger(self) -> int:
        """Take one checkpoint now; its id once complete. Raises :class:`CheckpointError` if it is
        aborted (a PE failed or erred, the timeout passed) or cannot start."""
        async with self.reconfigurer.lock:
            if not self.state.live or self.paused:
                raise CheckpointError(f"no checkpoint while the deployment is "
                                      f"{'recovering' if self.paused else self.state.state}")
            checkpoint_id, self.next_id = self.next_id, self.next_id + 1
            placement = self.reconfigurer.placement
            workers = sorted({pe.worker for pe in placement.pes.values()})
            t0, p0 = time.time(), time.perf_counter()
            self._interrupted = None
            try:
                results = await self._call(self._collect(checkpoint_id, placement, self.reconfigurer.epoch))
                if not self.state.live:     # a drain began meanwhile: sources may have ended early
                    raise CheckpointError(f"the deployment is {self.state.state}")
                size = await asyncio.to_thread(self._store, checkpoint_id, results, placement, t0,
                                               time.perf_counter() - p0)
            except Exception as exc:
                await self._abort(checkpoint_id, workers, exc)
                raise CheckpointError(f"checkpoint {checkpoint_id} aborted: {exc}") from exc
            try:
                await self._call(self.gateway.ckpt_end(workers, checkpoint_id, complete=True))
            except CheckpointError:
                pass                        # complete: the restore that interrupted commits it
            done = CompletedCheckpoint(checkpoint_id, t0, time.perf_counter() - p0, size,
                                       f"{self.store.url.rstrip('/')}/chk-{checkpoint_id:06d}")
        self.completed.append(done)
        self.completed_count += 1
        del self.completed[:-max(self.retain, 1) * 10]            # a bounded history for status
        await asyncio.to_thread(self.store.prune, self.retain)
        self.state.event("checkpoint", f"checkpoint {checkpoint_id} complete: {size} bytes in "
                                       f"{done.duration_s * 1000:.0f} ms")
        return checkpoint_id

    async def _collect(self, checkpoint_id: int, placement: "Placement", epoch: int) -> dict[str, dict]:
        """Barriers in at the source PEs; every PE's snapshot out (``pe_id -> result``). The first
        worker whose answer says the checkpoint cannot complete aborts it at once."""
        by_worker: dict[str, list[str]] = {}
        for pe_id, pe in placement.pes.items():
            by_worker.setdefault(pe.worker, []).append(pe_id)
        with_sources = {pe_id for pe_id, pe in placement.pes.items()
                        if any(placement.plan.ops[op].kind == "source" for op in pe.operators)}
        await _first_failure([self.gateway.ckpt_begin(w, checkpoint_id, [p for p in pes if p in with_sources], epoch)
                              for w, pes in by_worker.items()])
        answers = await _first_failure([self._snapshots(w, checkpoint_id, pes) for w, pes in by_worker.items()])
        results: dict[str, dict] = {}
        for answer in answers:
            results.update(answer)
        missing = [p for p in placement.pes if p not in results]
        if missing:
            raise CheckpointError(f"no snapshot from PE {', '.join(missing)} within {self.timeout:g} s")
        return results

    async def _snapshots(self, worker: str, checkpoint_id: int, pe_ids: list[str]) -> dict[str, dict]:
        """One worker's snapshots of ``checkpoint_id``; raises on the first PE that erred or is gone."""
        answer = await asyncio.wait_for(self.gateway.ckpt_wait(worker, checkpoint_id, pe_ids, self.timeout),
                                        self.timeout + self.gateway.worker_timeout)
        errors = [r["error"] for r in answer["results"].values() if "error" in r]
        if errors:
            raise CheckpointError(errors[0])
        return answer["results"]

    def _store(self, checkpoint_id: int, results: dict[str, dict], placement: "Placement", t0: float,
               took: float) -> int:
        """State files, placement, then the manifest (in a thread: off the control loop)."""
        files, positions, size = {}, {}, 0
        for pe_id, result in sorted(results.items()):
            name = f"{pe_id}.state"
            blob = cloudpickle.dumps({"ops": result["state"], "positions": result["positions"]})
            size += self.store.write(checkpoint_id, name, blob)
            files[pe_id] = {"path": name, "bytes": len(blob), "operators": list(placement.pes[pe_id].operators)}
            positions.update(result["positions"])
        size += self.store.write(checkpoint_id, "placement.pkl", cloudpickle.dumps(placement))
        self.store.commit_manifest(checkpoint_id, {
            "id": checkpoint_id, "deployment": self.reconfigurer.deployment, "time": t0,
            "duration_s": round(took, 6), "bytes": size, "files": files, "positions": positions,
            "placement": {pe_id: {"worker": pe.worker, "operators": list(pe.operators)}
                          for pe_id, pe in placement.pes.items()},
            "placement_file": "placement.pkl"})
        return size

    async def _abort(self, checkpoint_id: int, workers: list[str], exc: BaseException) -> None:
        self.aborted += 1
        self.last_error = f"checkpoint {checkpoint_id}: {type(exc).__name__}: {exc}"
        self.state.event("checkpoint", f"checkpoint {checkpoint_id} aborted: {exc}")
        try:                         # PEs still aligning on it go on (not when a restore stops them)
            await self._call(self.gateway.ckpt_end(workers, checkpoint_id, complete=False))
        except CheckpointError:
            pass
        await asyncio.to_thread(self.store.discard, checkpoint_id)

    def view(self) -> dict:
        """The checkpoint part of the status."""
        last = self.completed[-1].as_dict() if self.completed else None
        if last is not None:          # since it completed, as of this status (the views show it)
            last["age_s"] = round(max(0.0, time.time() - last["time"] - last["duration_s"]), 3)
        return {"storage": self.store.url, "interval_s": self.interval, "completed": self.completed_count,
                "aborted": self.aborted, "last": last, "last_error": self.last_error,
                "recent": [c.as_dict() for c in self.completed[-RECENT:]]}


async def _first_failure(calls: list) -> list:
    """Every call's answer; on the first that raises, the others are cancelled (and awaited:
    none is left running) and that exception is raised."""
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
