"""``import pescheduler``, an app file's imports and ``python -m pescheduler --help`` load no cluster
library: distributed alone costs about 0.4 s of every command's start (issue 34, part 2)."""

import subprocess
import sys

import pytest

HEAVY = ("distributed", "bokeh", "pyarrow", "pandas", "tornado")

PROBE = """
import sys
{code}
print("LOADED:", *(sorted(name for name in {heavy!r} if name in sys.modules)))
"""


def _loaded(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has imported after running ``code``."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code, heavy=HEAVY)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.splitlines()[-1].split()[1:]


@pytest.mark.parametrize("code", [
    "import pescheduler",
    "from pescheduler import Application, col, lit, Operator, Source, Sink, hookimpl",
    "import pescheduler.cli",
])
def test_no_cluster_library_imported(code):
    assert _loaded(code) == []


def test_help_imports_no_distributed():
    code = ("import runpy\nsys.argv = ['pescheduler', '--help']\n"
            "try:\n    runpy.run_module('pescheduler', run_name='__main__')\nexcept SystemExit:\n    pass")
    assert _loaded(code) == []


def test_public_names_still_there():
    """Every name of ``__all__`` resolves (lazily) to the object of its home module."""
    import pescheduler
    from pescheduler.control.deployment import deploy
    from pescheduler.plan.app import Application

    assert pescheduler.deploy is deploy and pescheduler.Application is Application
    assert all(getattr(pescheduler, name) is not None for name in pescheduler.__all__)
    assert set(pescheduler.__all__) <= set(dir(pescheduler))
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        pescheduler.nonsense
