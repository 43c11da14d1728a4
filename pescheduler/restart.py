"""When to try again: exponential backoff, and Flink's restart strategy built on it.

Pure bookkeeping (the caller passes the time and does the waiting), so the
rules are tested without a cluster. Two users: a checkpointed deployment's
recovery (``control/recovery.py``, ``pescheduler.restart.*``) and the
sinks' retries of a transient write or commit error (``pescheduler.sinks.retry.*``).

The restart strategy is Flink's *exponential-delay* strategy with its
*failure-rate* limit beside it:

- the n-th restore in a row waits ``backoff * multiplier**n``, at most ``max-backoff``;
- ``attempts`` restores in a row are allowed; a run that stays up ``reset-after``
  since its last restore is stable again: the count and the backoff start over;
- whatever the streak, more than ``max-failures-per-interval`` failures within
  ``failure-rate-interval`` fail the run (a job that keeps failing after long stable
  stretches is broken, not unlucky).

So a broker that is away for a few seconds costs a few restores a growing
pause apart, and the run goes on exactly once; a bug that fails every restore
ends the run after ``attempts``, loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import config


@dataclass(frozen=True)
class Backoff:
    """Pauses that grow by ``multiplier`` from ``initial`` up to ``cap`` (seconds)."""

    initial: float
    cap: float
    multiplier: float = 2.0

    def delay(self, attempt: int) -> float:
        """The pause before retry number ``attempt`` (0 for the first)."""
        return min(self.cap, self.initial * self.multiplier ** attempt)


@dataclass
class RestartStrategy:
    """Whether a failure at time ``now`` is restored, and after what pause (:meth:`on_failure`)."""

    backoff: Backoff
    attempts: int              # restores in a row, none a stable period after the one before
    reset_after: float         # seconds up after a restore that make the run stable again
    max_failures: int          # failures allowed within ``interval``, whatever the streak
    interval: float
    streak: int = 0            # restores since the run was last stable
    failures: list = field(default_factory=list)     # times of failures within ``interval``
    restored_at: float | None = None                 # when the last restore began running
    refused: str | None = None                       # why the last failure was not restored

    @classmethod
    def of_config(cls) -> "RestartStrategy":
        backoff = Backoff(config.get_seconds("restart.backoff"), config.get_seconds("restart.max-backoff"),
                          float(config.get("restart.backoff-multiplier")))
        return cls(backoff, int(config.get("restart.attempts")),
                   config.get_seconds("restart.reset-after"), int(config.get("restart.max-failures-per-interval")),
                   config.get_seconds("restart.failure-rate-interval"))

    def in_a_row(self, now: float) -> int:
        """Restores since the run was last stable, as of ``now``: what counts against ``attempts``
        (0 once the last restore has run ``reset_after`` without a failure)."""
        if self.restored_at is not None and now - self.restored_at >= self.reset_after:
            return 0
        return self.streak

    def on_failure(self, now: float) -> float | None:
        """The pause before restoring a failure at ``now``; None when the run must fail
        (:attr:`refused` says why)."""
        self.streak = self.in_a_row(now)          # stable since the last restore: a fresh start
        self.failures = [t for t in self.failures if now - t < self.interval] + [now]
        if len(self.failures) > self.max_failures:
            self.refused = (f"{len(self.failures)} failures within {self.interval:g} s "
                            f"(restart.max-failures-per-interval: {self.max_failures})")
            return None
        if self.streak >= self.attempts:
            self.refused = (f"no restart attempt left ({self.attempts} in a row, none stable for "
                            f"{self.reset_after:g} s; restart.attempts)")
            return None
        pause = self.backoff.delay(self.streak)
        self.streak += 1
        self.restored_at = now + pause
        return pause
