"""A ``.sql`` file as an app: ``python -m pescheduler deploy query.sql``.

The file is one query; comment lines before (or in) it name its sources and
its sink, each as a registry name and a JSON object of parameters::

    -- source cars: generator {"events": 20000, "seed": 1}
    -- sink: jsonl {"path": "fast.jsonl"}
    SELECT car, speed * 3.6 AS kmh FROM cars WHERE speed > 30

A comment whose first word is ``source`` or ``sink`` is such a line (written
wrong, it is an error). The whole text is handed to :func:`pescheduler.sql.sql` (SQL ignores the
comments), so an error's line and column are the file's. Every problem is an
``AppLoadError`` naming ``file:line:column``.
"""

from __future__ import annotations

import json
import os
import re

from ..errors import AppLoadError
from ..plan.app import Application

HEADER = re.compile(r"^\s*--\s*(source\s+(?P<source>\w+)|sink)\s*:\s*(?P<name>[\w.-]+)\s*(?P<params>\{.*)?$", re.I)
"""``-- source NAME: REGISTRY_NAME {json}`` or ``-- sink: REGISTRY_NAME {json}``."""
LOOKS_LIKE_HEADER = re.compile(r"^\s*--\s*(source|sink)\b", re.I)
"""A comment whose first word is source or sink is a header: written wrong, it is an error, not ignored."""
FIX = 'name each source and the sink in a comment: -- source cars: generator {"events": 1000}'


def load_sql_app(path: str) -> Application:
    """The Application of the ``.sql`` file at ``path``: its sources, the query, its sink."""
    from . import SQLError, sql

    with open(path) as f:
        text = f.read()
    app = Application(os.path.splitext(os.path.basename(path))[0])
    sources, sink = {}, None
    for number, line in enumerate(text.splitlines(), start=1):
        match = HEADER.match(line)
        if match is None and LOOKS_LIKE_HEADER.match(line):
            raise AppLoadError(path, f"not a source or sink line: {line.strip()}", FIX, number)
        if match:
            name, params = match["name"], _params(path, number, match["params"])
            if match["source"]:
                sources[match["source"]] = app.source(name, **params)
            else:
                sink = (name, params)
    if sink is None:
        raise AppLoadError(path, "the query has no sink", FIX)
    try:
        stream = sql(text, sources)
    except SQLError as exc:
        raise AppLoadError(path, str(exc).rsplit(" (line", 1)[0], FIX if "unknown source" in str(exc) else "",
                           exc.line, exc.column) from None
    stream.sink(sink[0], **sink[1])
    return app


def _params(path: str, number: int, text: str | None) -> dict:
    try:
        params = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise AppLoadError(path, f"the parameters are not a JSON object: {exc}", FIX, number) from None
    if not isinstance(params, dict):
        raise AppLoadError(path, "the parameters are not a JSON object", FIX, number)
    return params
