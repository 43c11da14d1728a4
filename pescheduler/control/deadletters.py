"""Dead letters the deployment received: kept (bounded), counted (all), judged at the end.

Every dead letter taken off a worker is counted here, whichever part of the
worker made it (an operator that raised, a tuple the channel could not
pickle), so the status counter equals what was received. A run in which an
operator dead-lettered more than ``pescheduler.dead-letters.max-ratio`` of
its input is not a success: :meth:`DeadLetters.verdict` says why.
"""

from __future__ import annotations

import json
import os
import pickle
from collections import Counter, deque

from .. import config
from ..metrics import MetricsSnapshot


class DeadLetters:
    """The newest ``pescheduler.dead-letters.keep`` dead letters, and a count of all per operator."""

    def __init__(self) -> None:
        self.kept: deque = deque(maxlen=int(config.get("dead-letters.keep")))
        self.per_op: Counter = Counter()
        self.path = config.get("dead-letters.path")
        self.max_ratio = float(config.get("dead-letters.max-ratio"))

    @property
    def count(self) -> int:
        return sum(self.per_op.values())

    def keep(self, dead: dict) -> None:
        """One dead letter as a worker sent it (the item pickled, or its repr)."""
        item = dead["item"]
        dead["item"] = pickle.loads(item["pickle"]) if "pickle" in item else item["repr"]
        self.kept.append(dead)
        self.per_op[dead.get("op", "")] += 1
        if self.path:
            with open(os.path.expanduser(self.path), "a") as f:
                f.write(json.dumps(dead, default=repr) + "\n")

    def verdict(self, snapshot: MetricsSnapshot) -> str | None:
        """Why the run failed by its dead letters (None when it did not): the first operator that
        dead-lettered more than ``max-ratio`` of the tuples it received (every one when it
        received none counted, as a source does)."""
        for op, n in sorted(self.per_op.items()):
            m = snapshot.operators.get(op)
            seen = max(m.tuples_in, m.tuples_out + n) if m is not None else n
            if seen and n / seen > self.max_ratio:
                return (f"{op} dead-lettered {n} of {seen} tuples ({n / seen:.0%}, more than "
                        f"pescheduler.dead-letters.max-ratio {self.max_ratio:g}); see dead_letters()")
        return None
