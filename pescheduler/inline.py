"""Inlining a map's or filter's lambda into the fused loop (``expr.compile_rows``).

Why: ``stream.map(lambda e: {**e, "speed": e["speed"] / 3.6})`` costs a
Python call per tuple per operator, which the hand-written loop it competes
with does not pay (issue 16: the deployed lambda app at 0.78x the hand loop,
the goal 0.8x). A one-expression lambda is the same code whether it is called
or written into the loop, so the fused loop runs its expression in place, as
Flink's code generation splices an operator's expression into the generated
function.

When: only when it is provably the same code. The lambda's source is found in
its file (``linecache``) and parsed; the candidate expression is recompiled
as a lambda and must give byte-identical code (``co_code``, constants,
names, parameter) to the function object's own. The lambda must read nothing
but its one parameter, literals, attributes and builtins the lambda's module
does not shadow: no globals, no closures, no defaults, no nested scope, no
``:=``. Anything else -- a ``def``, a partial, a lambda typed at a prompt, a
source file edited since -- is called as before. Only fused runs inline: a
batch that raises there is replayed operator by operator, each operator
calling its function, so a dead letter's traceback shows the user's own line.
:func:`proven` is that proof on its own, saying why when it fails; lifting a
lambda to an expression tree (``pescheduler.lift``) starts from it.
"""

from __future__ import annotations

import ast
import builtins
import dis
import linecache
from typing import Any, Callable

_TREES: dict[tuple[str, int], ast.AST | None] = {}     # (file, its length) -> parsed module
_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.NamedExpr,
           ast.Await, ast.Yield, ast.YieldFrom)


class NotProvable(Exception):
    """Why a function is not provably one expression of its own source (the text says it)."""


def inline(fn: Any, taken: Callable[[str], bool]) -> tuple[str, str] | None:
    """``(parameter, expression source)`` of ``fn`` when the loop may run it in place, else None.

    ``taken(name)``: the generated loop uses ``name`` itself; the lambda may use
    no such name (but ``t``, as its parameter: the tuple the loop hands over)."""
    try:
        node = proven(fn, 1)
    except NotProvable:
        return None
    param = fn.__code__.co_varnames[0]
    if (taken(param) and param != "t") or any(taken(name) for name in builtins_read(fn)):
        return None
    return param, ast.unparse(node.body)


def proven(fn: Any, arity: int, cells: bool = False) -> ast.Lambda:
    """The parsed lambda ``fn`` provably is (byte-identical code), reading only its ``arity``
    parameters, literals and unshadowed builtins (``cells``: and variables of enclosing functions,
    whose values :func:`cell_constants` then proves constant); else :class:`NotProvable` saying why."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__name__", None) != "<lambda>":
        raise NotProvable("it is not a lambda")
    if (code.co_argcount != arity or code.co_posonlyargcount or code.co_kwonlyargcount
            or code.co_flags & (0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200)   # *args **kw generator coroutine
            or getattr(fn, "__defaults__", None) or getattr(fn, "__kwdefaults__", None)):
        raise NotProvable(f"it does not take exactly {arity} plain parameter{'s' if arity > 1 else ''}")
    if (code.co_freevars and not cells) or code.co_cellvars:
        raise NotProvable(f"it reads a variable of an enclosing function ({', '.join(code.co_freevars)})")
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and (
                ins.argval in fn.__globals__ or not hasattr(builtins, ins.argval)):
            raise NotProvable(f"it reads the global {ins.argval!r}, which may change")
    node = _find(code)
    if node is None:
        raise NotProvable("its source is not found as it was compiled")
    if any(isinstance(n, _SCOPES) for n in ast.walk(node.body)):
        raise NotProvable("it has a scope of its own (a comprehension, a lambda, :=, await or yield)")
    return node


_SCALARS = (int, float, str, bool, type(None))
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_PARENT: dict[int, ast.AST] = {}        # id(node) -> its parent, over every tree of _TREES (kept: ids stay)


def cell_constants(fn: Any, node: ast.Lambda) -> dict[str, Any]:
    """The value of each variable of an enclosing function that the proven lambda ``fn`` (its
    ``node``) reads, where it provably never changes; else :class:`NotProvable` saying why.

    A closure cell can change while the lambda lives (the enclosing function assigns the
    variable again, in a loop, or a nested function declares it ``nonlocal``), so a value is
    taken only where the enclosing function's source binds the variable once: a parameter never
    assigned, or one ``name = ...`` statement outside any loop; once bound, it is that value for
    good. Values: int, float, str, bool, None (exactly those types: a subclass may redefine
    ``==``), or a tuple of them. Globals are never taken: any code may assign a module's name."""
    values = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            raise NotProvable(f"it reads {name!r} of an enclosing function, not bound yet") from None
        if not (type(value) in _SCALARS or (type(value) is tuple and all(type(v) in _SCALARS for v in value))):
            raise NotProvable(f"it reads {name!r} of an enclosing function, a {type(value).__name__} "
                              f"(an int, float, str, bool, None or a tuple of them is read as a literal)")
        why = _rebound(_owner(node, name), name)
        if why:
            raise NotProvable(f"it reads {name!r} of an enclosing function, which {why}: it may change")
        values[name] = value
    return values


def _owner(node: ast.AST, name: str) -> ast.AST | None:
    """The innermost enclosing function (or comprehension) whose own scope binds ``name``."""
    up = _PARENT.get(id(node))
    while up is not None:
        if isinstance(up, (*_FUNCTIONS, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) \
                and _binds(up, name):
            return up
        up = _PARENT.get(id(up))
    return None


def _binds(scope: ast.AST, name: str) -> bool:
    if isinstance(scope, _FUNCTIONS):
        if name in _params(scope):
            return True
        if any(isinstance(n, ast.Nonlocal) and name in n.names for n in _own(scope)):
            return False
    return any(name in _bound_names(n) for n in _own(scope))


def _params(fn: ast.AST) -> set[str]:
    a = fn.args
    return {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}


def _own(scope: ast.AST):
    """The nodes of ``scope`` not inside a nested function or class (a comprehension's are included:
    its ``:=`` binds here)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (*_FUNCTIONS, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))


def _bound_names(n: ast.AST) -> set[str]:
    """The names ``n`` binds, rebinds or unbinds (a conservative list: more only refuses more)."""
    if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
        return {n.id}
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {n.name}
    if isinstance(n, ast.ExceptHandler) and n.name:
        return {n.name}
    if isinstance(n, ast.alias):
        return {(n.asname or n.name).split(".")[0]}
    if isinstance(n, (ast.Global, ast.Nonlocal)):
        return set(n.names)
    if isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
        return {n.name}
    if isinstance(n, ast.MatchMapping) and n.rest:
        return {n.rest}
    return set()


def _rebound(owner: ast.AST | None, name: str) -> str | None:
    """Why the variable ``name`` of ``owner`` may hold another value later (None: it is bound once)."""
    if owner is None or not isinstance(owner, _FUNCTIONS):
        return "is a comprehension's variable" if owner is not None else "is not found in its source"
    bindings = [n for n in ast.walk(owner) if n is not owner and name in _bound_names(n)]
    if name in _params(owner):
        return "is assigned although a parameter" if bindings else None
    if len(bindings) != 1:
        return f"is bound {len(bindings)} times"
    statement = _PARENT.get(id(bindings[0]))
    if not (isinstance(statement, ast.Assign) and statement.targets == [bindings[0]]):
        return "is bound otherwise than by one `name = ...`"
    up = _PARENT.get(id(statement))
    while up is not None and up is not owner:
        if isinstance(up, _LOOPS):
            return "is assigned in a loop"
        up = _PARENT.get(id(up))
    return None


def builtins_read(fn: Any) -> set[str]:
    """The builtins a proven lambda reads (names it loads that are not its parameters)."""
    return {ins.argval for ins in dis.get_instructions(fn.__code__) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}


def _find(code: Any) -> ast.Lambda | None:
    """The lambda in ``code``'s source file that compiles to exactly ``code``."""
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return None
    key = (code.co_filename, sum(map(len, lines)))
    if key not in _TREES:
        try:
            _TREES[key] = ast.parse("".join(lines))
            _PARENT.update((id(c), p) for p in ast.walk(_TREES[key]) for c in ast.iter_child_nodes(p))
        except (SyntaxError, ValueError):
            _TREES[key] = None
    tree = _TREES[key]
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda) and node.lineno == code.co_firstlineno and _same(node, code):
            return node
    return None


def _same(node: ast.Lambda, code: Any) -> bool:
    """``node`` compiles to ``code``; one that reads variables of an enclosing function is compiled
    inside a function having them (``def _(i): return lambda ...``), so that they are its cells too."""
    outer = ast.FunctionDef("_", ast.arguments([], [ast.arg(v) for v in code.co_freevars], None, [], [], None, []),
                            [ast.Return(node)], [], None, None)
    tree = ast.fix_missing_locations(ast.Module([outer], [])) if code.co_freevars else ast.Expression(body=node)
    try:
        module = compile(tree, code.co_filename, "exec" if code.co_freevars else "eval")
    except (SyntaxError, ValueError, TypeError):
        return False
    if code.co_freevars:
        module = next((c for c in module.co_consts if hasattr(c, "co_code")), None)
    mine = next((c for c in getattr(module, "co_consts", ()) if hasattr(c, "co_code")), None)
    return (mine is not None and mine.co_code == code.co_code and mine.co_consts == code.co_consts
            and mine.co_names == code.co_names and mine.co_varnames == code.co_varnames
            and mine.co_freevars == code.co_freevars)
