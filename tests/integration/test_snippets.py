"""Every Python block of README.md and docs/*.md runs as pasted: alone, in a file, in a fresh directory.

A newcomer copies one block into ``x.py`` and runs ``python x.py``. Each
block here is written to its own file and run that way, in its own process
(so a block that deploys without an ``if __name__ == "__main__":`` guard is
run exactly as a user's script is). A block that is only a fragment says so
in its info string, `` ```python fragment ``, and is left out; a `` ```python broker ``
block needs a Kafka/Redis broker and is run by tests/integration/test_connectors_docs.py
against the brokers its fixtures start; a `` ```python postgres `` block needs a PostgreSQL server and
is run by tests/integration/test_postgres_cdc.py against the one its fixture starts.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(page.relative_to(ROOT).as_posix(), i, code) for page in PAGES
          for i, (info, code) in enumerate(FENCE.findall(page.read_text())) if not {"fragment", "broker", "postgres"} & set(info.split())]
BLOCK_TIMEOUT_S = 300


@pytest.mark.integration
@pytest.mark.parametrize("page, index, code", BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_block_runs_as_pasted(page, index, code, tmp_path):
    script = tmp_path / "pasted.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"{page} block {index} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-4000:]


def test_the_readme_and_the_docs_have_runnable_blocks_that_deploy():
    deploying = [(p, i) for p, i, code in BLOCKS if "deploy(" in code]
    assert any(p == "README.md" for p, _ in deploying) and len(BLOCKS) >= 10
