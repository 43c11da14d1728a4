"""A dead letter made readable: exception type, message, the user's file:line, a sample tuple.

A worker sends a dead letter's reason as traceback text; ``status`` shows the
first one per operator (with how many followed) and the newest few, so "dead
letters 4772" comes with the exception that made them. The user's line is
the deepest frame outside pescheduler, its plug-ins and the Python install;
cloudpickle sends the app's functions by value with their file named
``<dynamic-code>`` (line numbers kept), so such a frame is put back in the
file that added the operator.

Example::

    readable({"op": "map-2", "item": {"x": 0}, "error": traceback_text})
    # {"op": "map-2", "type": "ZeroDivisionError", "message": "division by zero",
    #  "where": "/home/me/app.py:7", "sample": "{'x': 0}"}
"""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig

SAMPLE_CHARS = 200
_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _not_the_users() -> tuple[str, ...]:
    """Directories whose frames are pescheduler's or Python's, not the app's."""
    # found, not imported: this module is imported by the package it names (no import cycle)
    dirs = [importlib.util.find_spec(m).submodule_search_locations[0]
            for m in ("pescheduler", "pescheduler.operators", "pescheduler.policies")]
    dirs += [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")]
    return tuple(os.path.join(d, "") for d in dirs)


DYNAMIC = "<dynamic-code>"      # cloudpickle's co_filename for code it pickled by value


def readable(dead: dict, app_file: str | None = None) -> dict:
    """``op``, ``type``, ``message``, ``where`` and ``sample`` of one dead letter as the controller got
    it; ``app_file``: the file that added its operator, for frames of code pickled by value."""
    lines = str(dead.get("error") or "").rstrip().splitlines()
    frames = [(i, m) for i, m in ((i, _FRAME.match(line)) for i, line in enumerate(lines)) if m]
    after = frames[-1][0] + 1 if frames else 0
    exception = next((line for line in lines[after:] if line and not line.startswith(" ")), "")
    kind, sep, message = exception.partition(": ")
    if not sep and not re.fullmatch(r"[\w.]+", kind):
        kind, message = "", exception
    return {"op": dead.get("op", ""), "type": kind, "message": message, "where": _users_line(frames, app_file),
            "sample": repr(dead.get("item"))[:SAMPLE_CHARS]}


def _users_line(frames: list, app_file: str | None) -> str:
    """``file:line`` of the deepest frame in the app's own code (the deepest of all without one)."""
    if not frames:
        return ""
    theirs = _not_the_users()
    mine = [m for _, m in frames if m["file"] == DYNAMIC or not m["file"].startswith(theirs + ("<",))]
    frame = (mine or [frames[-1][1]])[-1]
    file = app_file if frame["file"] == DYNAMIC and app_file else frame["file"]
    return f"{file}:{frame['line']}"
