"""Dead letters on their way to the controller, kept until it says it has them.

The monitor's ``pe_stats`` call hands a worker's new dead letters to the
deploying process. Handed over and forgotten at once, they were lost whenever
the answer was: a call given up after ``calls.worker`` (a loaded worker) still
ran here and took them off the PEs, and its answer went nowhere (a loaded run's
final status counted 0 of its 5 dead letters). So each letter gets a number, in
order, and stays here until a later call acknowledges it (``acked``: the highest
number the controller has received from this worker): an answer that is lost is
answered again, and the controller keeps each number once. ``incarnation``
tells a new PE host on the same address from this one (its numbers start again).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from typing import Iterable

logger = logging.getLogger(__name__)

UNACKED_MAX = 100_000      # letters kept per deployment for a controller that does not acknowledge;
                           # past it the oldest go (said once in the log)


class DeadLetterOutbox:
    """Per deployment, the dead letters handed over and not yet acknowledged."""

    def __init__(self) -> None:
        self.incarnation = uuid.uuid4().hex
        self._next = 1
        self._unacked: dict[str, deque] = {}
        self._warned: set[str] = set()

    def hand_over(self, deployment: str, fresh: Iterable[dict], acked: tuple | None) -> list[dict]:
        """Drop what the controller acknowledged (``acked``: ``(incarnation, seq)``, numbers up to
        ``seq`` when the incarnation is this one's; another's say nothing of these), number the
        ``fresh`` letters and return every letter not acknowledged, oldest first, each with its ``seq``."""
        incarnation, seq = acked or (None, 0)
        acked = seq if incarnation == self.incarnation else 0
        box = self._unacked.setdefault(deployment, deque())
        while box and box[0]["seq"] <= acked:
            box.popleft()
        for letter in fresh:
            if len(box) >= UNACKED_MAX:
                box.popleft()
                if deployment not in self._warned:
                    self._warned.add(deployment)
                    logger.warning("deployment %s: over %d dead letters not acknowledged by its controller; "
                                   "the oldest are dropped", deployment, UNACKED_MAX)
            box.append({**letter, "seq": self._next})
            self._next += 1
        return list(box)

    def forget(self, deployment: str) -> None:
        """The deployment is over here."""
        self._unacked.pop(deployment, None)
        self._warned.discard(deployment)
