"""The runnable examples in docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent.parent / "docs"
BLOCKS = [(path.name, i, code) for path in sorted(DOCS.glob("*.md"))
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))]


@pytest.mark.parametrize("name, index, code", BLOCKS, ids=[f"{n}-{i}" for n, i, _ in BLOCKS])
def test_docs_example_runs(name, index, code):
    exec(compile(code, f"{name}[{index}]", "exec"), {"__name__": f"docs_{index}"})


def test_docs_have_examples():
    assert len(BLOCKS) >= 2
