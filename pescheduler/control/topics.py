"""The scheduler event topics a deployment and ``stop`` ring each other on.

Why: the published status and the stop command live in the scheduler's metadata,
which nobody can wait on; polling it made ``stop`` take up to a poll interval on
each side. A topic event is pushed to its subscribers at once. The metadata
stays the record (``status`` reads it, a missed event is found there on the next
poll); the events only say "look now". No distributed import here: the command
line names the topics before it needs a client.
"""


def command_topic(deployment: str) -> str:
    """``stop`` logs ``"stop"`` here after leaving the command in the metadata (``ControlLoop`` takes it)."""
    return f"pescheduler-command-{deployment}"


def state_topic(deployment: str) -> str:
    """The deployment logs each new state it publishes here (``WorkerGateway.publish``)."""
    return f"pescheduler-state-{deployment}"
