"""Recovery: a lost worker, a lost host or a failed PE restores the last complete checkpoint.

Without checkpoints such a loss ends the run (``DeploymentFailed``). With
them, and while the restart strategy allows (``pescheduler/restart.py``,
``pescheduler.restart.*``: Flink's exponential delay with a failure-rate
limit), the deployment's ``_fail`` hands the loss here instead, and this
restores the **whole job** (not only the failed region, as Flink's region
failover would): after the strategy's pause, under the Reconfigurer's lock
(no checkpoint or reconfiguration meanwhile),

1. every PE still running is stopped;
2. the workers still alive are found (each must answer within a bound);
3. the app is re-compiled onto them and the checkpoint's state mapped onto
   that placement by operator id (``checkpoint/restore.py``), sources rewound to their
   checkpointed positions, sinks told to commit that checkpoint (again) and
   to discard what they staged after it (``worker/barriers.py``);
4. the PEs start; the embedded cluster starts a replacement worker in the
   background, so the next loss still finds room.

Each restart is recorded (status, events and the decision log) with the
time from the loss being noticed to the first tuple reaching a sink again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

from .. import config
from ..checkpoint.restore import load_states
from ..plan.compiler import compile_app
from ..restart import RestartStrategy

if TYPE_CHECKING:
    from ..checkpoint.coordinator import CheckpointCoordinator
    from ..plan.app import Application
    from ..plugins import Plugins
    from .cluster import EmbeddedCluster
    from .gateway import WorkerGateway
    from .reconfigurer import Reconfigurer
    from .state import DeploymentState

logger = logging.getLogger(__name__)

FIRST_OUTPUT_S = 120.0    # how long the first output after a restore is looked for


class Supervised(Protocol):
    """What a recovery drives of its deployment (``Deployment`` implements it): its parts, and the
    steps of its failure path that a restore takes over. Named here so this module need not
    import ``deployment.py``, which imports it."""

    id: str
    app: Application
    plugins: Plugins | None
    cluster: EmbeddedCluster | None
    gateway: WorkerGateway
    reconfigurer: Reconfigurer
    checkpointer: CheckpointCoordinator | None
    state: DeploymentState
    _generation: int
    _done: asyncio.Event | None

    def _watch_all(self, workers) -> None: ...

    async def _fail(self, reason: str, lost: set[str] = frozenset(), final: bool = False) -> None: ...


class Recovery:
    """The restores of one deployment: its restart strategy and its restarts so far."""

    def __init__(self, dep: Supervised, strategy: RestartStrategy) -> None:
        self.dep = dep
        self.strategy = strategy
        self.restarts: list[dict] = []
        self.dead: set[str] = set()              # workers known lost: never called again
        self._task: asyncio.Task | None = None
        self._background: list[asyncio.Task] = []
        self._replacing: list[asyncio.Task] = []     # replacement workers being started
        self._replace_lock = asyncio.Lock()
        dep.reconfigurer.lost = lambda: self.dead    # a cold start is refused beside a lost worker

    @property
    def replacing(self) -> bool:
        """A replacement worker is being started (embedded cluster)."""
        return any(not t.done() for t in self._replacing)

    @property
    def active(self) -> bool:
        return self._task is not None and not self._task.done()

    def handle(self, reason: str, lost: set[str]) -> bool:
        """Take the loss over (True: a restore runs, or already ran for it), or leave it to fail the run."""
        self.dead |= set(lost)
        if self.active:
            return True                          # the same loss, seen by another watcher
        if not self.dep.checkpointer.store.restorable():        # this run's own, or the one it started from
            self.dep.state.event("restart", "no complete checkpoint to restore yet")
            return False
        pause = self.strategy.on_failure(time.monotonic())
        if pause is None:
            self.dep.state.event("restart", self.strategy.refused)
            return False
        self.dep.checkpointer.interrupt(reason)      # the checkpoint in flight cannot complete now
        self._task = asyncio.create_task(self._restore(reason, pause), name="pescheduler recovery")
        return True

    async def _restore(self, reason: str, pause: float) -> None:
        dep, rc, coordinator = self.dep, self.dep.reconfigurer, self.dep.checkpointer
        p0, t_loss = perf_counter(), time.time()
        record = {"attempt": len(self.restarts) + 1, "in_a_row": self.strategy.streak, "of": self.strategy.attempts,
                  "at": t_loss, "backoff_s": round(pause, 3), "reason": reason.strip().splitlines()[0],
                  "lost": sorted(self.dead)}
        self.restarts.append(record)
        phases = record["phases"] = {}
        mark = [perf_counter()]

        def phase(name: str) -> None:        # seconds each step took (bench/recovery.py prints them)
            now = perf_counter()
            phases[name], mark[0] = round(now - mark[0], 3), now

        try:
            await asyncio.sleep(pause)
            phase("backoff")
            dep._generation += 1                 # watchers drop answers about the old PEs
            async with rc.lock.held("a recovery"):
                phase("lock")
                checkpoint_id = (await asyncio.to_thread(coordinator.store.restorable))[-1]
                record["checkpoint"] = checkpoint_id
                dep.state.event("restart", f"{record['reason']}: restoring checkpoint {checkpoint_id} "
                                           f"(attempt {record['in_a_row']} of {self.strategy.attempts} in a row, "
                                           f"after {pause:g} s)")
                # Every old PE stops. On workers taken for lost the call is not awaited: a dead
                # address is only given up after the gateway's bound (3 s), but a worker whose
                # watch only failed must still not go on writing beside the restore.
                old = rc.running_on()
                listed = await dep.gateway.workers()
                self.dead |= {w for w in old if w not in listed}    # the scheduler saw them go
                self._background.append(asyncio.create_task(dep.gateway.stop((w for w in old if w in self.dead),
                                                                             goes_on=True)))
                await dep.gateway.stop((w for w in old if w not in self.dead), goes_on=True)
                phase("stop")
                workers = await self._live()
                phase("probe")
                placement = compile_app(dep.app, dep.plugins, workers,
                                        {w: rc.worker_info[w]["host"] for w in workers}, dep.latency_s)
                phase("compile")
                states = await asyncio.to_thread(load_states, coordinator.store, checkpoint_id, placement)
                record["checkpoint"] = next((s["checkpoint"] for s in states.values()), checkpoint_id)
                phase("load")
                await rc.restart(placement, states)
                dep.state.running(placement.pes)
                phase("relaunch")
            dep._watch_all(placement.workers)
            record["restore_s"] = round(perf_counter() - p0, 3)
        except Exception as exc:
            logger.error("recovery failed", exc_info=True)
            record["error"] = f"{type(exc).__name__}: {exc}"
            await dep._fail(f"{reason}; restoring the last checkpoint failed: {record['error']}", final=True)
            return
        finally:
            coordinator.paused = False
        self._background.append(asyncio.create_task(self._first_output(record, p0, placement)))
        if dep.cluster is not None:
            self._replacing.append(asyncio.create_task(self._replace()))

    async def _live(self) -> list[str]:
        """Workers the scheduler lists that answer now (their PE host info refreshed)."""
        gateway, rc = self.dep.gateway, self.dep.reconfigurer
        info = await gateway.workers()
        candidates = [w for w in sorted(info) if w not in self.dead]
        answers = await asyncio.gather(*(self._probe(w) for w in candidates), return_exceptions=True)
        live = []
        for worker, answer in zip(candidates, answers):
            if isinstance(answer, BaseException):
                logger.info("worker %s taken for lost: %s", worker, answer)
                self.dead.add(worker)
                continue
            rc.know(worker, answer, info[worker].get("host", ""))
            live.append(worker)
        if not live and self.replacing:
            await asyncio.gather(*self._replacing, return_exceptions=True)   # a worker is on its way
            return await self._live()
        if not live:
            raise RuntimeError("no worker left to restore onto")
        return live

    async def _probe(self, worker: str) -> dict:
        """The worker's PE host info. No answer within ``calls.probe``: a worker the scheduler
        no longer lists is lost; one it still lists is only slow (a loaded machine) and is asked
        again, longer, before it is given up."""
        gateway = self.dep.gateway
        try:
            return await asyncio.wait_for(gateway.pe_info(worker), gateway.probe_timeout)
        except asyncio.TimeoutError:
            if worker not in await gateway.workers():
                raise TimeoutError(f"no answer within {gateway.probe_timeout:g} s and gone from the "
                                   f"scheduler") from None
        return await asyncio.wait_for(gateway.pe_info(worker), 10 * gateway.probe_timeout)

    async def _first_output(self, record: dict, p0: float, placement) -> None:
        """Time from the loss to the first tuple into a sink after the restore (in the record,
        the events and the decision log). Each worker is asked on its own: one that does not
        answer in time (a loaded worker, one lost since) must not hide a sink's count on another.
        None within :data:`FIRST_OUTPUT_S`: the record's ``first_output_missing`` and the event
        say why, from the last look: the sinks the workers that answered hold (none took a tuple),
        and each worker that did not answer with its error; or that the deployment ended first.
        ("Not seen" alone could not tell a stream that stopped from a sink's worker that never
        answered.)"""
        sinks = {op for op, o in placement.plan.ops.items() if o.kind == "sink"}
        workers = sorted({pe.worker for pe in placement.pes.values()})
        deadline = perf_counter() + FIRST_OUTPUT_S
        answers, failed, looked = [], {}, False
        while perf_counter() < deadline and not self.dep._done.is_set():
            answers, failed = await self.dep.gateway.stats_each(workers, dead_letters=False)
            looked = True
            if any(s["operators"].get(op, {}).get("tuples_in", 0) for a in answers
                   for s in a["pes"].values() for op in sinks):     # restored PEs count from 0
                record["first_output_s"] = round(perf_counter() - p0, 3)
                break
            await asyncio.sleep(0.02)
        if "first_output_s" in record:
            seen = f"first output {record['first_output_s']} s after the loss"
        else:
            held = sorted(op for a in answers for s in a["pes"].values() for op in s["operators"] if op in sinks)
            why = ["the deployment ended first"] if self.dep._done.is_set() else []
            if looked:
                why.append(f"no tuple into {', '.join(held)} on the workers that answered" if held else
                           f"no answer holding a sink ({', '.join(sorted(sinks))})")
                why += [f"no answer from {w}: {exc!r}" for w, exc in sorted(failed.items())]
            record["first_output_missing"] = "; ".join(why)
            seen = (f"first output not seen within {perf_counter() - p0:.0f} s of the loss "
                    f"({record['first_output_missing']})")
        self.dep.state.event("restart", f"attempt {record['attempt']}: restored checkpoint "
                                        f"{record.get('checkpoint')} in {record.get('restore_s')} s, {seen}")
        self._log(record)

    async def _replace(self) -> None:
        """Start a worker for the one lost, so later losses still find room (embedded cluster;
        one at a time: each takes the workers that joined and nobody knows yet)."""
        dep, rc = self.dep, self.dep.reconfigurer
        async with self._replace_lock:
            try:
                await dep.cluster.grow(dep.gateway.client)
                info = await dep.gateway.workers()
            except Exception as exc:
                logger.warning("starting a replacement worker failed: %s", exc)
                return
            for worker in [w for w in info if w not in rc.worker_info and w not in self.dead]:
                try:
                    answer = await self._probe(worker)
                except Exception:
                    self.dead.add(worker)
                    continue
                if worker not in rc.worker_info:
                    await rc.add_workers(info[worker].get("host", ""), {worker: answer})
                    dep._watch_all([worker])

    def _log(self, record: dict) -> None:
        path = config.get("policies.decision-log")
        if not path:
            return
        path = os.path.expanduser(path)
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps({"deployment": self.dep.id, "kind": "restart", **record}, default=repr) + "\n")
        except OSError as exc:
            logger.warning("cannot write the decision log %s: %s", path, exc)

    def view(self) -> dict:
        """The restart part of the status: the strategy and what it did (``in_a_row`` counts against
        ``attempts``; ``used`` is every restore of the run)."""
        return {"attempts": self.strategy.attempts, "backoff_s": self.strategy.backoff.initial,
                "used": len(self.restarts), "in_a_row": self.strategy.in_a_row(time.monotonic()),
                "restarts": [dict(r) for r in self.restarts[-10:]]}

    async def close(self) -> None:
        tasks = [t for t in [self._task, *self._background, *self._replacing] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
