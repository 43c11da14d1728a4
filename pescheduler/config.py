"""Settings through dask.config under ``pescheduler`` (defaults in pescheduler.yaml).

One home for every knob, where Dask users already look; read values with
:func:`get`, never with literals scattered in the code.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_DEFAULTS = os.path.join(os.path.dirname(__file__), "pescheduler.yaml")

with open(_DEFAULTS) as _f:
    dask.config.update_defaults(yaml.safe_load(_f))

# dask reads DASK_PESCHEDULER__X; the short PESCHEDULER__X form is ours and documented.
_ENV_PREFIX = "PESCHEDULER__"
_env = {"DASK_PESCHEDULER__" + k[len(_ENV_PREFIX):]: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)}
if _env:
    dask.config.update(dask.config.config, dask.config.collect_env(_env), priority="new")


def get(key: str, default: Any = None) -> Any:
    """``pescheduler.<key>`` from dask.config, e.g. ``get("batch.size")``."""
    return dask.config.get(f"pescheduler.{key}", default=default)


def get_seconds(key: str) -> float:
    """A duration setting (``"1s"``, ``"500ms"``, a number of seconds) in seconds."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key), default="seconds"))


def load_file(path: str) -> dict:
    """Read a YAML config file (the ``--config`` option) and apply it; returns what it set.

    A file without the ``pescheduler:`` top level is taken as its content.
    """
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config file must hold a mapping, got {type(data).__name__}")
    if "pescheduler" not in data:
        data = {"pescheduler": data}
    dask.config.update(dask.config.config, data, priority="new")
    return data
