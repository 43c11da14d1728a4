"""The control loop: collect → snapshot → policies → merge → apply → record, every monitor interval.

One task per deployment. Each interval it collects every worker's counters
(and dead letters), folds them into the monitor's snapshot and publishes the
status; then, when policies are active, it starts a controller round
(``controller.py``: policies in threads with deadlines, hysteresis, merge,
cooldown, apply through the :class:`~pescheduler.control.reconfigurer.Reconfigurer`,
record). A round runs beside the loop and never two at once: applying may
take a while, and a round still running when the next snapshot comes skips
that snapshot. Between intervals the loop looks for a stop command every
:data:`COMMAND_POLL_S`, and at once when ``stop`` rings the deployment's command topic
(``WorkerGateway.on_command``); that poll is also the scheduler's heartbeat (a
scheduler that does not answer ends the run, as a lost scheduler).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from .. import config
from .controller import Controller
from .deadletters import DeadLetters
from .gateway import SchedulerLost, WorkerGateway
from .monitor import Monitor
from . import stall
from .reconfigurer import Reconfigurer
from .state import DeploymentState

logger = logging.getLogger(__name__)

COMMAND_POLL_S = 0.5     # how often a stop command from the CLI (and the scheduler) is looked for


class ControlLoop:
    """Collects, decides and applies on a timer; see the module docstring."""

    def __init__(self, gateway: WorkerGateway, reconfigurer: Reconfigurer, state: DeploymentState,
                 monitor: Monitor, dead: DeadLetters, publish: Callable[[], dict]) -> None:
        self.gateway = gateway
        self.reconfigurer = reconfigurer
        self.state = state
        self.monitor = monitor
        self.dead = dead
        self.publish = publish                  # the status dict to publish after each collect
        self.controller: Controller | None = None
        self.on_stop: Callable[[], Awaitable[None]] = _nothing           # a stop command came
        self.on_scheduler_lost: Callable[[str], Awaitable[None]] = _nothing_said
        self.on_dead_letters: Callable[[str], Awaitable[None]] = _nothing_said   # over max-ratio: fail
        self.sampled = asyncio.Event()          # set (and replaced) after each collect
        # worker -> (its PE host's incarnation, the newest dead letter's seq received from it): a
        # worker keeps its dead letters until a later call says they were received (dead_outbox.py)
        self.acked: dict[str, tuple[str, int]] = {}
        self._round: asyncio.Task | None = None
        self._ticked = None

    async def collect(self) -> bool:
        """Every worker's counters into a snapshot; dead letters kept; the status published. False
        when a worker did not answer (a lost worker is reported by its watcher): the dead letters
        of those that did are kept all the same, those of the others come with a later call
        (worker/dead_outbox.py), and no snapshot is made of a part of the workers."""
        answers, failed = await self.gateway.stats_each(self.reconfigurer.running_on(), acked=self.acked)
        for answer in answers:
            for dead in self._new(answer):
                first = self.dead.keep(dead)
                if first is not None:
                    self.state.event("error", f"{first['op']} raised {first['type'] or 'an error'}: "
                                              f"{first['message']} at {first['where'] or '?'} "
                                              f"(its first dead letter; `status --dead-letters 20`)")
        if failed:
            logger.debug("collect: no answer from %s", {w: repr(e) for w, e in failed.items()})
            return False
        snapshot = self.monitor.update(answers, self.reconfigurer.placement)
        self.reconfigurer.activated(answers)      # copies that processed their first batch since
        self.reconfigurer.loaded(answers)         # restored PEs whose key groups are all in
        await stall.check(self, answers)          # no progress with input pending: stalled, then failed
        too_many = self.dead.verdict(snapshot, running=True) if self.state.live else None
        if too_many:
            self.state.event("dead letters", too_many)
            logger.error("deployment fails: %s", too_many)
            await self.on_dead_letters(too_many)
        for pe_id, m in snapshot.pes.items():
            if m.threaded and pe_id not in self.state.threaded:
                self.state.threaded.add(pe_id)
                self.state.event("thread", f"PE {pe_id} works in its own thread: "
                                           f"{m.threaded_because or 'its operators block or run long'}")
            elif not m.threaded and pe_id in self.state.threaded:
                self.state.threaded.discard(pe_id)
                self.state.event("thread", f"PE {pe_id} is back on its worker's event loop: its turns are short")
        self.sampled.set()                 # wake next_snapshot() callers, then re-arm
        self.sampled = asyncio.Event()
        await self.gateway.publish(self.publish())
        return True

    def _new(self, answer: dict) -> list[dict]:
        """The dead letters of ``answer`` not received before (a worker answers each one until a
        call acknowledges it), in order; the newest is acknowledged with the next call."""
        worker, incarnation = answer["worker"], answer["incarnation"]
        seen = self.acked.get(worker, (None, 0))
        since = seen[1] if seen[0] == incarnation else 0
        new = [d for d in answer["dead_letters"] if d["seq"] > since]
        if new:
            self.acked[worker] = (incarnation, new[-1]["seq"])
        return [{k: v for k, v in d.items() if k != "seq"} for d in new]

    async def run(self, done: asyncio.Event) -> None:
        """Until ``done``: collect every interval, start rounds, obey commands, watch the scheduler."""
        interval = config.get_seconds("monitor.interval")
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        rung = asyncio.Event()                  # a command was left: take it now, not at the next poll
        self.gateway.on_command(rung.set)
        try:
            while not done.is_set():
                await _first(done, rung, max(0.0, min(due, loop.time() + COMMAND_POLL_S) - loop.time()))
                rung.clear()
                if done.is_set():
                    break
                if loop.time() >= due:
                    await self._guarded(self.collect)
                    due = loop.time() + interval
                    self._start_round()
                await self._guarded(self._commands)
        finally:
            await self._cancel_round()

    async def _guarded(self, step: Callable[[], Awaitable[None]]) -> None:
        """``step``, with a failure logged (traceback) and put on the record instead of ending the
        loop: a monitor that stopped silently would blind the policies, status and stall detection."""
        try:
            await step()
        except Exception as exc:
            logger.exception("control loop: %s failed", step.__name__)
            self.state.event("error", f"control loop: {step.__name__} failed: {exc!r}")

    def _start_round(self) -> None:
        """A controller round on the newest snapshot, unless one is still running."""
        snap = self.monitor.latest
        if self.controller is None or (self._round is not None and not self._round.done()) \
                or snap is self._ticked or not self.state.live:
            return
        self._ticked = snap
        self._round = asyncio.create_task(self.controller.tick(snap, self.reconfigurer.placement))
        self._round.add_done_callback(_report)

    async def _commands(self) -> None:
        try:
            command = await self.gateway.take_command()
        except SchedulerLost as exc:
            await self.on_scheduler_lost(str(exc))
            return
        if command == "stop":
            await self.stop_requested()

    async def stop_requested(self) -> None:
        """``stop`` from the command line: left on the scheduler (:meth:`_commands`) or asked on the
        deploying process's socket (:mod:`.stopsocket`); drains once."""
        if not self.state.ended:
            self.state.event("stop", "stop requested from the command line")
            await self.on_stop()

    async def _cancel_round(self) -> None:
        if self._round is not None and not self._round.done():
            self._round.cancel()
            await asyncio.gather(self._round, return_exceptions=True)


async def _first(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    """Until ``a`` or ``b`` is set, or ``timeout`` passes."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _report(task: asyncio.Task) -> None:
    """A failed round (a bug, not a policy: those are quarantined) is logged; the next runs."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("control round failed", exc_info=task.exception())


async def _nothing() -> None:
    return None


async def _nothing_said(why: str) -> None:
    return None
