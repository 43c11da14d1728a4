"""``pip install`` of the package alone, in a fresh venv, as a new user types it (issue 36, item 3).

The core install does not bring pyarrow, yet ``parquet`` is a built-in sink: an app that writes
parquet must exit 2 before any worker starts, naming the sink's line and the pip command that
fixes it — not start, abort every checkpoint on the workers and leave its output empty (what it
did). tests/unit/test_requirements.py checks the same with pyarrow refused by an import finder in
this environment; this one builds the environment a user has: a venv without this machine's
packages, the package installed by pip with only its declared dependencies.
"""

from __future__ import annotations

import subprocess
import textwrap
import venv
from pathlib import Path

import pytest

# The fixture's pip install is bounded by its own 900 s; pytest-timeout's 300 s counts it too, and
# beside two busy loops a suite's install took longer (session 79).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

REPO = Path(__file__).parent.parent.parent

APP = textwrap.dedent("""
    from pescheduler import Application

    app = Application("lake")
    (app.source("iterable", items=[{"ts": 1, "v": 1}])
        .sink("parquet", path=OUT))
""")


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> Path:
    """A venv with pip, the package installed into it from this checkout with its core dependencies."""
    where = tmp_path_factory.mktemp("fresh-venv")
    venv.create(where, with_pip=True, clear=True)
    python = where / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO)],
                   check=True, timeout=900, cwd=where)
    return python


def test_a_fresh_install_without_pyarrow_refuses_a_parquet_app_with_the_fix(fresh_python, tmp_path):
    missing = subprocess.run([str(fresh_python), "-c", "import pyarrow"], capture_output=True, text=True)
    assert missing.returncode != 0 and "No module named 'pyarrow'" in missing.stderr   # the premise
    app = tmp_path / "app.py"
    app.write_text(APP.replace("OUT", repr(str(tmp_path / "out"))))
    run = subprocess.run([str(fresh_python), "-m", "pescheduler", "deploy", str(app), "--workers", "2"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "PESCHEDULER__STATE_DIR": str(tmp_path / "state")})
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{app}:6: parquet-2: sink 'parquet' needs pyarrow, which is not installed" in run.stderr, run.stderr
    assert 'fix: pip install "pescheduler[columnar]"' in run.stderr
    assert "deploying" not in run.stdout and not (tmp_path / "out").exists()
