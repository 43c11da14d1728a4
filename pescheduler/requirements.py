"""What a plug-in needs installed, checked before any worker starts.

An operator, source or sink class, or a policy module, that imports a library
only when it runs (pyarrow for ``parquet``, a Kafka client) declares it, so a missing
library fails the deploy at once with the command that fixes it instead of
every batch or checkpoint failing later on the workers::

    class ParquetSink(Sink):
        name = "parquet"
        requires = ("pyarrow",)              # top-level import names
        install = "pescheduler[columnar]"    # what `pip install` gets them (default: the names)
"""

from __future__ import annotations

import importlib.util


def missing(cls) -> list[str]:
    """The modules ``cls.requires`` names that cannot be imported here (``cls``: a class or a module)."""
    return [name for name in getattr(cls, "requires", ()) if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):       # a finder that refuses the name, or a broken parent
        return False


def pip_command(cls, names: list[str]) -> str:
    """``pip install ...`` that provides ``names`` for ``cls`` (its ``install``, else the names)."""
    what = getattr(cls, "install", "") or " ".join(names)
    return f'pip install "{what}"' if "[" in what else f"pip install {what}"


def problem(kind: str, name: str, cls) -> tuple[str, str] | None:
    """``(problem, fix)`` when ``cls`` lacks something it requires, else None."""
    absent = missing(cls)
    if not absent:
        return None
    return (f"{kind} {name!r} needs {', '.join(absent)}, which {'is' if len(absent) == 1 else 'are'} "
            f"not installed", pip_command(cls, absent))
