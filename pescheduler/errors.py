"""Exceptions with messages that name the fix."""


class PeschedulerError(Exception):
    """Base of pescheduler's own errors."""


class InvalidApplication(PeschedulerError, ValueError):
    """The application graph is wrong (unknown operator, no sink, bad parameters)."""


class AppLoadError(PeschedulerError):
    """app.py could not be loaded; the message names file, line and fix."""


class DeploymentFailed(PeschedulerError):
    """A running deployment failed; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
