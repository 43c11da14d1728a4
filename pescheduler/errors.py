"""Exceptions with messages that name the fix.

The command line prints these messages as they are, without a traceback, so
each message must say where the problem is and what to do about it.
"""

from __future__ import annotations


class PeschedulerError(Exception):
    """Base of pescheduler's own errors."""


class InvalidApplication(PeschedulerError, ValueError):
    """The application graph is wrong (unknown operator, no sink, bad parameters)."""


class ConfigError(PeschedulerError, ValueError):
    """A ``pescheduler`` setting is unknown or has a bad value; the message names key, value and fix."""


class AppLoadError(PeschedulerError):
    """app.py could not be loaded: the message names ``file[:line[:column]]``, the problem and the fix.

    ``file``, ``line``, ``column`` (None when unknown), ``problem`` and ``fix``
    stay available as attributes so tools can point at the spot without
    parsing the message.
    """

    def __init__(self, file: str, problem: str, fix: str = "", line: int | None = None,
                 column: int | None = None) -> None:
        self.file, self.problem, self.fix, self.line, self.column = file, problem, fix, line, column
        where = file + (f":{line}" if line else "") + (f":{column}" if line and column else "")
        super().__init__(f"{where}: {problem}" + (f"\n  fix: {fix}" if fix else ""))

    def __reduce__(self):
        # The message is built from the parts, so rebuild from the parts (pickling
        # an exception otherwise calls the class with ``args`` = the message alone).
        return type(self), (self.file, self.problem, self.fix, self.line, self.column)


class AppCheckFailed(AppLoadError, InvalidApplication):
    """The app loaded but does not check (an unknown operator, bad parameters, its graph's shape),
    found before any cluster starts; the message names the file and line that wrote the operator.

    Both an :class:`AppLoadError` (file, line, fix) and an :class:`InvalidApplication`.
    """


class DeploymentFailed(PeschedulerError):
    """A running deployment failed; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        from .redact import redact

        reason = redact(reason)      # it is printed and published: no URL password in it
        super().__init__(reason)
        self.reason = reason


class DeliveryFailed(PeschedulerError):
    """A sink could not hand output to its external system (a write, a delivery or a commit
    failed, transient errors retried first). Never a dead letter: the PE fails, so a checkpointed
    run restores its last checkpoint (and the sink commits again) and any other run fails loudly;
    re-running the batch tuple by tuple would write part of it twice."""


class NotReplayable(PeschedulerError):
    """A source that cannot rewind cannot take part in a checkpoint."""


class CheckpointError(PeschedulerError, ValueError):
    """A checkpoint cannot be taken or restored (none complete in the storage, an unknown id, a
    checkpoint that timed out); the message names the storage and the id."""


class CheckpointDamaged(CheckpointError):
    """A stored checkpoint fails its checks (a file missing, truncated, or not matching its signature,
    a manifest not signed with this deployment's key): it is never loaded; a restore falls back to
    the previous intact one and logs this reason."""


class DeploymentClash(PeschedulerError, ValueError):
    """A deployment of the same name, or one writing the same file, is already running; the message
    names both and the fix. Refused before anything starts: both would truncate and interleave output."""


class PythonOnly(ArithmeticError):
    """A backend cannot give Python's exact result for this batch (a null, a zero divisor, a type
    it does not map exactly): the rows are run by the Python function instead."""
