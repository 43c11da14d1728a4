"""The planner builds wire specs without importing the worker's runtime (issue 12)."""

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


def test_the_planner_imports_only_the_wire_specs_from_the_worker_side():
    reached = {name for path in PLAN.glob("*.py") for name in _imports(path) if "worker" in name}
    assert reached == {"..worker.specs"}


def test_the_wire_specs_are_the_runtimes_own():
    from pescheduler.worker import runtime, specs

    assert runtime.PESpec is specs.PESpec and specs.PESpec.__module__ == "pescheduler.worker.specs"
