"""Stall detection: no PE makes progress while input is pending.

Credit-based channels cannot deadlock by construction (worker/flow.py), but a
stall can still come from elsewhere (an operator stuck in a call, a lost
credit frame, a bug): the symptom the user saw in issue 20 was every PE at
backpressure 1.0, 0 tuples/s, state ``running`` and exit 0. This watches the
counters the monitor collects anyway; it costs nothing on the data path.

Progress is any change of a PE's cumulative counters (tuples in and out per
operator, tuples and batches per channel). Pending input is a queued batch in
some PE's inbox or a batch buffered on an output channel. When neither
progress nor an empty pipeline has been seen for ``pescheduler.stall.timeout``
the deployment goes to state ``stalled`` with an event naming the PEs and
channels waiting on each other (and the wait cycle, if there is one); when
progress resumes it goes back to ``running``; a stall that lasts another
``timeout`` fails the deployment, so the CLI exits non-zero. A running
reconfiguration restarts the clock: it has a deadline of its own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from .. import config

logger = logging.getLogger(__name__)


@dataclass
class StallDetector:
    """Per deployment: the last counters seen, and since when nothing moved."""

    timeout_s: float
    last: tuple = ()
    since: float = field(default_factory=time.monotonic)
    stalled_at: float | None = None

    def observe(self, answers: list[dict], now: float, reconfiguring: bool = False) -> str | None:
        """Fold one monitor round in; returns ``"stalled"``, ``"cleared"``, ``"failed"`` or None."""
        counters = progress(answers)
        if counters != self.last or reconfiguring or not pending(answers):
            self.last, self.since = counters, now
            if self.stalled_at is not None:
                self.stalled_at = None
                return "cleared"
            return None
        if self.stalled_at is None and now - self.since >= self.timeout_s:
            self.stalled_at = now
            return "stalled"
        if self.stalled_at is not None and now - self.stalled_at >= self.timeout_s:
            return "failed"
        return None


def progress(answers: list[dict]) -> tuple:
    """Every cumulative counter that moves when a PE does work, in a fixed order."""
    out = []
    for answer in answers:
        for pe_id, s in sorted(answer["pes"].items()):
            out.append((pe_id, s["state"],
                        tuple(sorted((o, v["tuples_in"], v["tuples_out"]) for o, v in s["operators"].items())),
                        tuple(sorted((c, v["tuples"], v["batches"]) for c, v in s["channels_out"].items())),
                        tuple(sorted((c, v["tuples"]) for c, v in s["channels_in"].items()))))
    return tuple(sorted(out))


def pending(answers: list[dict]) -> bool:
    """Is there input some running PE has not processed, or output it has not shipped?"""
    return any(s["state"] == "running" and (s["queue_batches"] or any(c["pending"] for c in s["channels_out"].values()))
               for answer in answers for s in answer["pes"].values())


def waits(answers: list[dict]) -> list[str]:
    """Who waits on whom: ``A -[channel]-> B`` for each output out of credit with data buffered."""
    pes = {pe: s for a in answers for pe, s in a["pes"].items()}
    lines, edges = [], {}
    for pe, s in sorted(pes.items()):
        for cid, c in sorted(s["channels_out"].items()):
            if c["pending"] and c["credits"] <= 0:
                dst = cid.split("->", 1)[1] if "->" in cid else "?"     # <dep>/<epoch>/<src>.<port>-><PE>
                queued = pes.get(dst, {}).get("queue_batches", "?")
                lines.append(f"{pe} -[{cid}]-> {dst} (no credit, {c['pending']} buffered; "
                             f"{dst} has {queued} batches queued)")
                edges.setdefault(pe, set()).add(dst)
    cycle = _cycle(edges)
    if cycle:
        lines.append("wait cycle: " + " -> ".join(cycle))
    queued = [f"{pe} ({s['queue_batches']} batches queued)" for pe, s in sorted(pes.items()) if s["queue_batches"]]
    if queued:
        lines.append("input queued at: " + ", ".join(queued))
    return lines


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


_detectors: "WeakKeyDictionary[object, StallDetector]" = WeakKeyDictionary()


async def check(loop, answers: list[dict]) -> None:
    """One monitor round of a deployment's :class:`ControlLoop`: mark, clear or fail a stall."""
    detector = _detectors.get(loop)
    if detector is None:
        detector = _detectors[loop] = StallDetector(config.get_seconds("stall.timeout"))
    state = loop.state
    if state.state not in ("running", "stalled"):
        return
    verdict = detector.observe(answers, time.monotonic(), reconfiguring=loop.reconfigurer.lock.locked())
    if verdict == "stalled" and state.to("stalled"):
        text = (f"no PE made progress for {detector.timeout_s:.0f}s with input pending; "
                + "; ".join(waits(answers) or ["no output is waiting for credit"]))
        state.event("stalled", text)
        logger.error("deployment stalled: %s", text)
    elif verdict == "cleared" and state.to("running"):
        state.event("stalled", "progress resumed")
    elif verdict == "failed":
        await loop.reconfigurer.on_failure(f"stalled: no progress for {2 * detector.timeout_s:.0f}s with "
                                           f"input pending; " + "; ".join(waits(answers)))
