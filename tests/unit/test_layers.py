"""The layers are rules (issue 35): which package may import which, and no import cycle.

Every import counts: at module level, inside functions and under
``TYPE_CHECKING`` (a type-only import still ties the modules together: moving
either drags the other). The contract types the layers share live between
them, at the top level: ``wire.py`` (what a PE is built from), ``metrics.py``
(what policies see), ``resources.py`` (what a resource manager implements).
"""

from __future__ import annotations

import ast
import shutil
from functools import cache
from pathlib import Path

import networkx as nx

import pescheduler
import pescheduler.operators
import pescheduler.policies

TREES = {"pescheduler": Path(pescheduler.__file__).parent,
         "pescheduler.operators": Path(pescheduler.operators.__file__).parent,
         "pescheduler.policies": Path(pescheduler.policies.__file__).parent}

SUBPACKAGES = {p.name for p in TREES["pescheduler"].iterdir() if (p / "__init__.py").exists()} | {
    "operators", "policies"}

FORBIDDEN = {                    # package -> packages it must not import
    "plan": {"worker", "control", "checkpoint"},
    "worker": {"control", "checkpoint", "plan"},
    "checkpoint": {"control"},
    "policies": {"control"},
    "resource_managers": {"control"},
}


def modules(trees: dict[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every module of the trees (the operators and policies trees are
    mapped into the package, as the editable install does)."""
    found = {}
    for base, root in trees.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[0] in ("operators", "policies") and base == "pescheduler" or ".venv" in parts:
                continue
            found[".".join([base] + [p for p in parts if p != "__init__"])] = path
    return found


def import_graph(trees: dict[str, Path]) -> nx.DiGraph:
    """Module -> the modules of the trees it imports, anywhere in its code (edge ``lines``: where)."""
    mods = modules(trees)
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(name, path.name == "__init__.py", node):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
                    graph.edges[name, target].setdefault("lines", []).append(node.lineno)
    return graph


def _targets(module: str, is_package: bool, node: ast.AST) -> list[str]:
    """The modules an import statement names: ``from x import y`` names ``x.y`` when that is a
    module, else ``x`` (:func:`import_graph` walks a name up to the module that holds it)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    prefix = node.module
    if node.level:
        base = module.split(".")[: None if is_package else -1]
        base = base[: len(base) - node.level + 1]
        prefix = ".".join(base + [node.module] if node.module else base)
    return [f"{prefix}.{alias.name}" for alias in node.names]


def package(module: str) -> str:
    """The layer a module belongs to: its subpackage of ``pescheduler`` (operators and policies
    included); a top-level module is its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else module


def broken_rules(graph: nx.DiGraph) -> list[str]:
    """Every import a rule forbids, as ``module:line -> module``."""
    return [f"{a}:{graph.edges[a, b]['lines'][0]} -> {b}" for a, b in graph.edges
            if package(b) in FORBIDDEN.get(package(a), ())]


def package_cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Cycles among the subpackages (top-level modules, the facade ``pescheduler/__init__``
    among them, are checked as modules)."""
    packages = nx.DiGraph()
    for a, b in graph.edges:
        pa, pb = package(a), package(b)
        if pa != pb and {pa, pb} <= SUBPACKAGES:
            packages.add_edge(pa, pb)
    return list(nx.simple_cycles(packages))


def module_cycles(graph: nx.DiGraph) -> list[list[str]]:
    return [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]


@cache
def _the_tree() -> nx.DiGraph:
    return import_graph(TREES)


def test_no_layer_imports_one_it_must_not():
    assert broken_rules(_the_tree()) == []


def test_no_cycle_among_the_packages():
    assert package_cycles(_the_tree()) == []


def test_no_cycle_among_the_modules():
    assert module_cycles(_the_tree()) == []


def test_a_deliberate_bad_import_anywhere_in_a_module_breaks_the_rules(tmp_path):
    """The checks see what they must: a copy of the tree with one import added (a type-only one
    in the planner, a function-local one in the worker) breaks a rule and makes a cycle."""
    trees = {base: shutil.copytree(root, tmp_path / base, ignore=shutil.ignore_patterns("__pycache__"))
             for base, root in TREES.items()}
    wiring, chain = trees["pescheduler"] / "plan" / "wiring.py", trees["pescheduler"] / "worker" / "chain.py"
    wiring.write_text(wiring.read_text() + "\nif TYPE_CHECKING:\n    from ..control.gateway import WorkerGateway\n")
    chain.write_text(chain.read_text() + "\n\ndef _late():\n    from ..plan.wiring import build_specs\n")
    graph = import_graph(trees)
    assert set(broken_rules(graph)) >= {f"pescheduler.plan.wiring:{len(wiring.read_text().splitlines())} -> "
                                        "pescheduler.control.gateway",
                                        f"pescheduler.worker.chain:{len(chain.read_text().splitlines())} -> "
                                        "pescheduler.plan.wiring"}
    assert ["control", "plan", "worker"] in [sorted(c) for c in package_cycles(graph)]


def test_the_wire_specs_are_the_runtimes_own():
    from pescheduler import wire
    from pescheduler.worker import runtime

    assert runtime.PESpec is wire.PESpec and wire.PESpec.__module__ == "pescheduler.wire"


RUNTIME = {"asyncio", "dask", "distributed", "multiprocessing", "psutil", "socket", "subprocess", "threading"}


def runtime_imports(trees: dict[str, Path], layer: str = "plan") -> list[str]:
    """Every import of a runtime library (a cluster, an event loop, processes, sockets) by a module
    of ``layer``, anywhere in its code, as ``module:line -> library``: the planner is pure, so the
    same plan comes out on a laptop, in a test and on the cluster, and a policy can simulate it."""
    found = []
    for name, path in modules(trees).items():
        if package(name) != layer:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
            found += [f"{name}:{node.lineno} -> {n}" for n in names if n.partition(".")[0] in RUNTIME]
    return found


def test_the_planner_imports_no_runtime_library():
    assert runtime_imports(TREES) == []


def test_a_deliberate_runtime_import_in_the_planner_is_found(tmp_path):
    trees = {base: shutil.copytree(root, tmp_path / base, ignore=shutil.ignore_patterns("__pycache__"))
             for base, root in TREES.items()}
    state = trees["pescheduler"] / "plan" / "state.py"
    state.write_text(state.read_text() + "\n\ndef _late():\n    import distributed\n")
    assert runtime_imports(trees) == [f"pescheduler.plan.state:{len(state.read_text().splitlines())} -> distributed"]
