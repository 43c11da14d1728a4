"""The planner builds wire specs without importing the worker (issue 12, issue 35)."""

from __future__ import annotations

import ast
from pathlib import Path

import pescheduler

PLAN = Path(pescheduler.__file__).parent / "plan"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add("." * node.level + node.module)
    return names


def test_the_planner_imports_nothing_of_the_worker_side():
    reached = {name for path in PLAN.glob("*.py") for name in _imports(path) if "worker" in name}
    assert reached == set()


def test_the_wire_specs_are_the_runtimes_own():
    from pescheduler import wire
    from pescheduler.worker import runtime

    assert runtime.PESpec is wire.PESpec and wire.PESpec.__module__ == "pescheduler.wire"
