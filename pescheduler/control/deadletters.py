"""Dead letters the deployment received: kept (bounded), counted (all), judged at the end.

Every dead letter taken off a worker is counted here, whichever part of the
worker made it (an operator that raised, a tuple the channel could not
pickle), so the status counter equals what was received. A run in which an
operator dead-lettered more than ``pescheduler.dead-letters.max-ratio`` of
its input is not a success: :meth:`DeadLetters.verdict` says why, at the
end of a finite run and after every monitor window of a running one (an
endless run that dead-letters everything fails within a window or two, not
never). The ratio is over an operator's recent tuples
(``dead-letters.window``), not since the start: a burst late in a long run
is not diluted by the hours of good input before it.
"""

from __future__ import annotations

import json
import os
import pickle
from collections import Counter, deque

from .. import config
from ..metrics import MetricsSnapshot
from .failures import readable


HISTORY = 10_000    # samples kept per operator: at one a monitor window, hours of a slow operator's input


class DeadLetters:
    """The newest ``pescheduler.dead-letters.keep`` dead letters, and a count of all per operator."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = files or {}     # operator id -> the file that added it (failures.readable)
        self.kept: deque = deque(maxlen=int(config.get("dead-letters.keep")))
        self.per_op: Counter = Counter()
        self.path = config.get("dead-letters.path")
        self.max_ratio = float(config.get("dead-letters.max-ratio"))
        self.first: dict[str, dict] = {}      # operator -> its first dead letter, readable (failures.py)
        self.shown = int(config.get("dead-letters.recent"))
        self.judge_after = int(config.get("dead-letters.judge-after"))
        self.window = int(config.get("dead-letters.window"))
        # operator -> (tuples seen, dead letters) as of each verdict, oldest first: the sliding window
        self.history: dict[str, deque] = {}

    @property
    def count(self) -> int:
        return sum(self.per_op.values())

    def keep(self, dead: dict) -> dict | None:
        """One dead letter as a worker sent it (the item pickled, or its repr); returns it readable
        when it is its operator's first (the live view's events show that one)."""
        item = dead["item"]
        dead["item"] = pickle.loads(item["pickle"]) if "pickle" in item else item["repr"]
        self.kept.append(dead)
        self.per_op[dead.get("op", "")] += 1
        if self.path:
            with open(os.path.expanduser(self.path), "a") as f:
                f.write(json.dumps(dead, default=repr) + "\n")
        if dead.get("op", "") in self.first:
            return None
        first = self.first[dead.get("op", "")] = self._readable(dead)
        return first

    def errors(self) -> list[dict]:
        """The first dead letter of each operator, readable, with how many it has made."""
        return [{**first, "count": self.per_op[op]} for op, first in sorted(self.first.items())]

    def recent(self) -> list[dict]:
        """The newest ``pescheduler.dead-letters.recent`` dead letters, readable, oldest first."""
        return [self._readable(d) for d in list(self.kept)[-self.shown:]] if self.shown else []

    def _readable(self, dead: dict) -> dict:
        return readable(dead, self.files.get(str(dead.get("op", "")).split("#", 1)[0]))

    def verdict(self, snapshot: MetricsSnapshot, running: bool = False) -> str | None:
        """Why the run failed by its dead letters (None when it did not): the first operator that
        dead-lettered more than ``max-ratio`` of the tuples it received (every one when it
        received none counted, as a source does). ``running``: judged mid-run, only operators
        that have seen ``judge-after`` tuples (a first handful is no ratio)."""
        least = self.judge_after if running else 1
        verdict = None
        for op in sorted(set(self.per_op) | set(snapshot.operators)):
            n, m = self.per_op[op], snapshot.operators.get(op)
            seen, dead = self._recent(op, max(m.tuples_in, m.tuples_out + n) if m is not None else n, n)
            if verdict is None and seen >= least and dead / seen > self.max_ratio:
                verdict = (f"{op} dead-lettered {dead} of {seen} {'recent ' if seen < self._seen(op) else ''}"
                           f"tuples ({dead / seen:.0%}, more than pescheduler.dead-letters.max-ratio "
                           f"{self.max_ratio:g}); see dead_letters()")
        return verdict

    def _recent(self, op: str, seen: int, dead: int) -> tuple[int, int]:
        """``op``'s tuples seen and dead-lettered over its sliding window: since the newest sample
        at least ``window`` tuples back (from the start while it has not seen that many). Every
        operator is sampled at every verdict, so one whose first dead letter comes late is
        judged on its recent tuples too."""
        samples = self.history.setdefault(op, deque([(0, 0)], maxlen=HISTORY))
        samples.append((seen, dead))
        while len(samples) > 2 and seen - samples[1][0] >= self.window:
            samples.popleft()
        return seen - samples[0][0], dead - samples[0][1]

    def _seen(self, op: str) -> int:
        return self.history[op][-1][0]
