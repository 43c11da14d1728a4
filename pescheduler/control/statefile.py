"""The file that lets ``status`` and ``stop`` find an embedded cluster without ``--cluster``.

An embedded cluster listens on a port chosen at start, so the deploying
process writes its scheduler address to ``pescheduler.state-file``; the file
is removed by the process that wrote it (its pid is in the file).
"""

from __future__ import annotations

import json
import os

from .. import config


def path() -> str:
    return os.path.expanduser(config.get("state-file"))


def write(scheduler: str, app_name: str) -> None:
    target = path()
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as f:
        json.dump({"scheduler": scheduler, "app": app_name, "pid": os.getpid()}, f)


def remove() -> None:
    """Remove the file if this process wrote it."""
    target = path()
    try:
        with open(target) as f:
            if json.load(f).get("pid") == os.getpid():
                os.remove(target)
    except (OSError, ValueError):
        pass
