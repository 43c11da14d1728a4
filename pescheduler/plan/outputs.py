"""Where an application writes on this machine's file system: its sinks' local paths.

Two running deployments writing the same file truncate and interleave each
other's output silently, so a deploy is refused when one of these paths is
also written by a running deployment (``control/statefile.py`` holds theirs).
A sink names the parameters that hold where it writes with ``writes``
(default ``("path",)``), or makes ``writes(params)`` a function returning
the paths (``iceberg``: the table in its catalog's file); URLs with a scheme
other than ``file://`` are not local and are left out.

Example::

    written_paths(app, plugins)      # ['/home/me/out/avg_kmh.jsonl']
"""

from __future__ import annotations

import os

from .app import Application


def written_paths(app: Application, plugins) -> list[str]:
    """The absolute local paths ``app``'s sinks write, sorted."""
    found = set()
    for node in app.nodes.values():
        cls = plugins.operators.get((node.kind, node.name))
        if node.kind != "sink" or cls is None:
            continue
        writes = getattr(cls, "writes", ("path",))
        for where in writes(node.params) if callable(writes) else map(node.params.get, writes):
            local = _local(where)
            if local:
                found.add(local)
    return sorted(found)


def _local(where) -> str | None:
    if not isinstance(where, (str, os.PathLike)):
        return None
    text = os.fspath(where)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif "://" in text:
        return None
    return os.path.abspath(os.path.expanduser(text))


def overlapping(mine: list[str], theirs: list[str]) -> list[str]:
    """Paths of ``mine`` equal to, inside or around one of ``theirs`` (a directory sink and a file in it)."""
    return [p for p in mine for q in theirs if p == q or p.startswith(q + os.sep) or q.startswith(p + os.sep)]
