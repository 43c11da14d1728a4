"""The worker gateway: every call from the control plane to the cluster, typed, in one place.

The control plane talks to PE hosts (``worker/pehost.py``'s handlers) and to
the scheduler (worker list, published status, stop commands) only through a
:class:`WorkerGateway`. Calls that may reach a dead worker are bounded
(``pescheduler.calls.*``), where it would otherwise hold them for Dask's
connect timeout (30 s): the ending paths (``stop``, ``drain``, a checkpoint's
end) and everything a recovery calls after a loss must be quick.

The reconfiguration protocol (``protocol.execute``) makes its steps' calls
here too (``pause``, ``drain_status``, ``snapshot``, ``stop_pes``, ``deploy``,
``rewire``): every handler name a PE host answers is spelled in this module only.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Awaitable, Callable, Iterable

import cloudpickle
from distributed import Client

from .. import config
from ..dask_client import close_client
from ..worker.handshake import new_secret
from ..plan.placement import Placement
from ..wire import PESpec
from .topics import command_topic, state_topic

logger = logging.getLogger(__name__)


async def bounded(call: Callable[[], Awaitable], timeout: float) -> Any:
    """``call()``, a worker's RPC, given up after ``timeout``. The RPC's coroutine is made here,
    once this runs: a gather of ``wait_for(rpc(...))`` cancelled before its children started
    (a deployment stopping mid-poll) closed each ``wait_for`` unstarted, and the RPC coroutine
    it held was never awaited (the suite's RuntimeWarnings, sessions 36-39).
    """
    return await asyncio.wait_for(call(), timeout)


class SchedulerLost(ConnectionError):
    """The scheduler did not answer: the run cannot go on (and no worker is to blame)."""


class WorkerGateway:
    """Typed calls to the PE hosts of one deployment and to its scheduler."""

    def __init__(self, client: Client, deployment: str, plugins: tuple[str, ...]) -> None:
        self.client = client
        self.deployment = deployment
        self.secret = new_secret()            # proves our PEs to each other (worker/handshake.py)
        self.plugins = plugins
        self.checkpoint = False               # the deployment takes checkpoints (set by deploy): PEs are told
        self.state = "memory"                 # its keyed-state backend (set by deploy): PEs are told
        self.worker_timeout = config.get_seconds("calls.worker")
        self.probe_timeout = config.get_seconds("calls.probe")
        self.scheduler_timeout = config.get_seconds("calls.scheduler")

    # -- the scheduler ---------------------------------------------------------------------
    async def workers(self) -> dict[str, dict]:
        """``address -> scheduler's worker info`` of every worker now in the cluster; raises
        :class:`SchedulerLost` when the scheduler does not answer within ``calls.scheduler``
        (a connected but slow one is given ten times as long: a loaded machine)."""
        try:
            info = await asyncio.wait_for(self.client.scheduler.identity(n_workers=-1), self.scheduler_timeout)
        except asyncio.TimeoutError:
            if self.client.status != "running":
                raise SchedulerLost(f"no answer within {self.scheduler_timeout:g} s, "
                                    f"client {self.client.status}") from None
            info = await asyncio.wait_for(self.client.scheduler.identity(n_workers=-1), 10 * self.scheduler_timeout)
        return dict(info["workers"])

    async def publish(self, status: dict) -> None:
        """Publish the status (``python -m pescheduler status`` reads it); failures are logged only.
        A new state is also logged on :func:`state_topic`, so ``stop`` learns it at once."""
        try:
            await asyncio.wait_for(self.client.set_metadata(["pescheduler", "deployments", self.deployment],
                                                            status), self.scheduler_timeout)
            if status.get("state") != self._published_state:
                await asyncio.wait_for(self.client.log_event(state_topic(self.deployment), status.get("state")),
                                       self.scheduler_timeout)
                self._published_state = status.get("state")
        except Exception as exc:
            logger.debug("publishing status failed: %s", exc)

    _published_state: str | None = None

    def on_command(self, ring: Callable[[], None]) -> None:
        """Call ``ring`` as soon as a command is left for this deployment (``stop`` logs an event on
        :func:`command_topic` after it set the command): the loop then takes it at once, instead
        of at its next poll."""
        self.client.subscribe_topic(command_topic(self.deployment), lambda event: ring())

    async def take_command(self) -> str | None:
        """A command (``stop``) the CLI left for this deployment, taken once; raises
        :class:`SchedulerLost` when the scheduler does not answer (the poll is the heartbeat)."""
        key = ["pescheduler", "commands", self.deployment]
        try:
            command = await asyncio.wait_for(self.client.get_metadata(key, default=None), self.scheduler_timeout)
            if command:
                await asyncio.wait_for(self.client.set_metadata(key, None), self.scheduler_timeout)
        except asyncio.TimeoutError as exc:
            if self.client.status == "running":     # connected but slow (a loaded machine): not gone
                return None
            raise SchedulerLost(f"no answer within {self.scheduler_timeout:g} s, client {self.client.status}") from exc
        except OSError as exc:
            raise SchedulerLost(f"{type(exc).__name__}: {exc}") from exc
        return command

    async def scheduler_alive(self) -> bool:
        """False when the client lost its scheduler connection or a call to it fails; a call
        that is only slow (a loaded machine) counts as alive."""
        if self.client.status != "running":
            return False
        try:
            await asyncio.wait_for(self.client.scheduler.identity(n_workers=0), self.scheduler_timeout)
        except asyncio.TimeoutError:
            return self.client.status == "running"
        except Exception:
            return False
        return True

    async def first_gone(self, workers: list[str]) -> str | None:
        """The first of ``workers`` that is gone: a call to it fails (an open connection to a dead
        process breaks at once) or the scheduler no longer lists it; None when all are there. A
        call that only times out does not count: a loaded machine, or a new connection to a dead
        address, which Dask retries until its connect timeout; the scheduler's list decides then."""
        answers = await asyncio.gather(*(bounded(self.client.rpc(w).pe_info, self.probe_timeout)
                                         for w in workers), return_exceptions=True)
        listed = await self.workers()
        for worker, answer in zip(workers, answers):
            refused = isinstance(answer, Exception) and not isinstance(answer, asyncio.TimeoutError)
            if refused or worker not in listed:
                return worker
        return None

    # -- PE hosts ------------------------------------------------------------------------
    async def pe_info(self, worker: str) -> dict:
        """The worker's PE host: pid, cores, slots (the answer ``build_specs`` places with).
        Every worker the deployment learns is asked here, so it also gets the data-plane secret
        (and learns whether the deployment takes checkpoints, and its keyed-state backend)."""
        await self.client.rpc(worker).pe_secret(deployment=self.deployment, secret=self.secret,
                                                checkpoint=self.checkpoint, state=self.state)
        return await self.client.rpc(worker).pe_info()

    async def launch(self, specs: dict[str, PESpec], placement: Placement) -> list[str]:
        """Ship every PE's spec and start it, one call per worker, all at once: a channel to a
        PE another worker has not built yet waits for it there (``PEHost._expect``). The PEs
        whose restored key groups load while they run (``worker/lazy_restore.py``)."""
        by_worker: dict[str, list[PESpec]] = {}
        for pe_id, spec in specs.items():
            by_worker.setdefault(placement.pes[pe_id].worker, []).append(spec)
        answers = await asyncio.gather(*(self.deploy(w, s) for w, s in by_worker.items()))
        return [pe_id for answer in answers for pe_id in (answer or {}).get("loading", ())]

    async def deploy(self, worker: str, specs: list[PESpec]) -> dict:
        """Build these PEs on ``worker`` and start them; answers the handler's timings."""
        return await self.client.rpc(worker).pe_deploy(specs=cloudpickle.dumps(specs), plugins=self.plugins,
                                                       start=True)

    async def warm(self, slots_per_worker: dict[str, int]) -> None:
        """Warm standard slots: plug-ins imported, a thread per slot started."""
        await asyncio.gather(*(self.client.rpc(w).pe_warm(plugins=self.plugins, slots=n)
                               for w, n in slots_per_worker.items()))

    async def stats(self, workers: Iterable[str], dead_letters: bool = True, acked: tuple | None = None) -> list[dict]:
        """Every worker's cumulative PE counters (and, by default, its dead letters not yet
        acknowledged: ``acked``, the newest received from it, ``(incarnation, seq)``).
        Each call is given up after ``calls.worker`` (raising): a worker SIGKILLed a moment ago
        otherwise holds its caller for Dask's 30 s connect retry (the control loop then published
        no status and ran no policy for 30 s after every loss)."""
        return list(await asyncio.gather(*(
            bounded(partial(self.client.rpc(w).pe_stats, deployment=self.deployment, dead_letters=dead_letters,
                            acked=acked), self.worker_timeout) for w in workers)))

    async def stats_each(self, workers: Iterable[str], dead_letters: bool = True,
                         acked: dict[str, tuple] | None = None) -> tuple[list[dict], dict]:
        """:meth:`stats` with each worker asked on its own (``acked``: worker -> the newest dead
        letter received from it, ``(incarnation, seq)``): the answers that came, and each worker
        that did not answer in time or failed, with why. One worker's failure must not drop the
        others' answers (a ``gather`` that raised lost them, and the dead letters in them)."""
        workers, acked = list(workers), acked or {}
        asked = await asyncio.gather(*(self.stats([w], dead_letters, acked.get(w)) for w in workers),
                                     return_exceptions=True)
        answers = [a for one in asked if not isinstance(one, BaseException) for a in one]
        return answers, {w: one for w, one in zip(workers, asked) if isinstance(one, BaseException)}

    async def watch(self, worker: str, version: int, timeout: float) -> dict:
        """Long-poll the PE states on ``worker`` newer than ``version``."""
        return await self.client.rpc(worker).pe_wait(deployment=self.deployment, version=version,
                                                     timeout=timeout)

    # -- a reconfiguration's steps (control/protocol.py; unbounded here: the protocol bounds each step)
    async def pause(self, worker: str, marker: str, hold: dict[str, list[str]], align: list[str],
                    release: list[str], overtake: dict[str, list[str]], drain: dict | None = None,
                    carry: list[str] = (), overdraw: dict[str, list[str]] | None = None) -> dict | None:
        """Upstream PEs send ``marker`` and hold these channels; the PEs in ``align`` align on it
        (``carry``: those that may hand their queued input over with their key groups;
        ``overdraw``: PE -> its output channels that ship behind the marker without credit).
        ``drain``: :meth:`drain_status`'s arguments (but the marker): the call then also answers
        the drain's first look on ``worker`` (one round trip, not two)."""
        return await self.client.rpc(worker).pe_reconf(deployment=self.deployment, marker=marker, hold=hold,
                                                       align=align, release=release, overtake=overtake, drain=drain,
                                                       **({"carry": list(carry)} if carry else {}),
                                                       **({"overdraw": overdraw} if overdraw else {}))

    async def drain_status(self, worker: str, marker: str, aligned: list[str], seen: dict[str, list[str]],
                           timeout: float, queued: dict[str, list[str]] | None = None) -> dict:
        """Long-poll until these PEs aligned on (or took, or for ``queued``: have queued) ``marker``:
        what is missing, how far it got."""
        return await self.client.rpc(worker).pe_reconf_wait(deployment=self.deployment, marker=marker,
                                                             aligned=aligned, seen=seen, timeout=timeout,
                                                             queued=queued)

    async def snapshot(self, worker: str, pe_ids: list[str], leave_out: list[str] = ()) -> bytes:
        """The aligned PEs' operator states, progress and source positions (cloudpickled), but
        the operators ``leave_out`` names."""
        return await self.client.rpc(worker).pe_snapshot(deployment=self.deployment, pe_ids=pe_ids,
                                                         leave_out=list(leave_out))

    async def handover(self, worker: str, moves: list[dict], stop: list[str] = (), snapshot: list[str] = (),
                       leave_out: list[str] = ()) -> dict:
        """The aligned PEs on ``worker`` export these key-group moves and send them to their new
        owners' workers; answers counts and bytes sent, never the groups' state. ``snapshot``:
        retired PEs there whose other operators' states (but ``leave_out``'s) are answered after
        the export (``"snapshot"``, as :meth:`snapshot`'s); ``stop``: retired PEs there that stop
        right after, in the same call (``HandOvers.pe_handover``)."""
        extra = {"snapshot": list(snapshot), "leave_out": list(leave_out)} if snapshot else {}
        return await self.client.rpc(worker).pe_handover(deployment=self.deployment, moves=moves, stop=list(stop),
                                                         **extra)

    async def handover_expect(self, worker: str, moves: list[dict]) -> dict:
        """Running instances on ``worker`` gate the key groups these moves bring them."""
        return await self.client.rpc(worker).pe_handover_expect(deployment=self.deployment, moves=moves)

    async def handover_go(self, worker: str, tag: str) -> None:
        """The pause of reconfiguration ``tag`` is over: ``worker`` sends its parts now."""
        await self.client.rpc(worker).pe_handover_go(deployment=self.deployment, tag=tag)

    async def handover_wait(self, worker: str, tag: str, timeout: float) -> dict:
        """Until the key groups reconfiguration ``tag`` moves to ``worker`` are all in (bounded)."""
        return await self.client.rpc(worker).pe_handover_wait(deployment=self.deployment, tag=tag, timeout=timeout)

    async def stop_pes(self, worker: str, pe_ids: list[str]) -> list[str]:
        """Stop these PEs (retired ones); raises what the worker raised."""
        return await self.client.rpc(worker).pe_stop(deployment=self.deployment, pe_ids=pe_ids)

    async def rewire(self, worker: str, pe_id: str, **changes: Any) -> dict:
        """Change a PE that stays (``PEHost.pe_rewire``'s arguments); answers its parts' timings."""
        return await self.client.rpc(worker).pe_rewire(deployment=self.deployment, pe_id=pe_id, **changes)

    async def calls(self, worker: str) -> dict:
        """The deploys and rewires of this deployment still open on ``worker``, with their parts
        done, and its PEs' output channels still opening (a step that waits: where it stands)."""
        return await bounded(partial(self.client.rpc(worker).pe_calls, deployment=self.deployment),
                             self.worker_timeout)

    # -- checkpoints (pescheduler/checkpoint/coordinator.py) ------------------------------
    async def ckpt_begin(self, worker: str, checkpoint_id: int, pe_ids: list[str], epoch: int) -> None:
        """Start checkpoint ``checkpoint_id`` of ``epoch`` at these PEs (those with sources); bounded:
        a worker that does not answer within ``calls.worker`` aborts the checkpoint."""
        await bounded(partial(self.client.rpc(worker).pe_ckpt_begin, deployment=self.deployment,
                              checkpoint_id=checkpoint_id, pe_ids=pe_ids, epoch=epoch), self.worker_timeout)

    async def ckpt_wait(self, worker: str, checkpoint_id: int, pe_ids: list[str], timeout: float) -> dict:
        """Whether the PEs' snapshots for ``checkpoint_id`` are all taken (or ``timeout``); the worker holds them."""
        return await self.client.rpc(worker).pe_ckpt_wait(deployment=self.deployment, checkpoint_id=checkpoint_id,
                                                          pe_ids=pe_ids, timeout=timeout)

    async def ckpt_write(self, worker: str, checkpoint_id: int, pe_ids: list[str], storage: str) -> dict:
        """The worker writes its PEs' snapshots of ``checkpoint_id`` into ``storage`` itself; their
        manifest entries (the caller bounds it by the checkpoint's timeout)."""
        return await self.client.rpc(worker).pe_ckpt_write(deployment=self.deployment, checkpoint_id=checkpoint_id,
                                                           pe_ids=pe_ids, storage=storage)

    async def ckpt_progress(self, worker: str, checkpoint_id: int) -> int | None:
        """Bytes ``worker`` has written of ``checkpoint_id`` so far (None: no write of it going on
        there); bounded by ``calls.worker``."""
        answer = await bounded(partial(self.client.rpc(worker).pe_ckpt_progress, deployment=self.deployment,
                                       checkpoint_id=checkpoint_id), self.worker_timeout)
        return answer["bytes"]

    async def ckpt_end(self, workers: Iterable[str], checkpoint_id: int, complete: bool) -> None:
        """Sinks commit (``complete``) or discard checkpoint ``checkpoint_id``; bounded per worker."""
        workers = list(workers)
        calls = [bounded(partial(self.client.rpc(w).pe_ckpt_end, deployment=self.deployment,
                                 checkpoint_id=checkpoint_id, complete=complete), self.worker_timeout)
                 for w in workers]
        for w, result in zip(workers, await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(result, BaseException):     # a timeout's str() is empty: say which
                why = (f"no answer within {self.worker_timeout:g} s (pescheduler.calls.worker)"
                       if isinstance(result, asyncio.TimeoutError) else repr(result))
                logger.warning("ending checkpoint %s on %s failed: %s", checkpoint_id, w, why)

    async def drain(self, workers: Iterable[str]) -> None:
        """End the sources on ``workers`` as if exhausted (bounded; a dead worker is skipped)."""
        await self._ending("pe_drain", workers)

    async def stop(self, workers: Iterable[str], goes_on: bool = False) -> None:
        """Stop the deployment's PEs on ``workers`` (bounded; a dead worker is skipped). ``goes_on``:
        a recovery's stop, after which the workers keep their checkpoint copies (``PEHost.pe_stop``)."""
        await self._ending("pe_stop", workers, goes_on=goes_on)

    async def _ending(self, handler: str, workers: Iterable[str], **kwargs) -> None:
        workers = list(workers)
        calls = [bounded(partial(getattr(self.client.rpc(w), handler), deployment=self.deployment, **kwargs),
                         self.worker_timeout) for w in workers]
        for w, result in zip(workers, await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(result, BaseException):
                logger.debug("%s on %s failed: %s", handler, w, result)

    async def close(self) -> None:
        await close_client(self.client, self.worker_timeout)
