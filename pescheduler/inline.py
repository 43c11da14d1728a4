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


def proven(fn: Any, arity: int) -> ast.Lambda:
    """The parsed lambda ``fn`` provably is (byte-identical code), reading only its ``arity``
    parameters, literals and unshadowed builtins; else :class:`NotProvable` saying why."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__name__", None) != "<lambda>":
        raise NotProvable("it is not a lambda")
    if (code.co_argcount != arity or code.co_posonlyargcount or code.co_kwonlyargcount
            or code.co_flags & (0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200)   # *args **kw generator coroutine
            or getattr(fn, "__defaults__", None) or getattr(fn, "__kwdefaults__", None)):
        raise NotProvable(f"it does not take exactly {arity} plain parameter{'s' if arity > 1 else ''}")
    if code.co_freevars or code.co_cellvars:
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
    try:
        module = compile(ast.Expression(body=node), code.co_filename, "eval")
    except (SyntaxError, ValueError):
        return False
    mine = next((c for c in module.co_consts if hasattr(c, "co_code")), None)
    return (mine is not None and mine.co_code == code.co_code and mine.co_consts == code.co_consts
            and mine.co_names == code.co_names and mine.co_varnames == code.co_varnames)
