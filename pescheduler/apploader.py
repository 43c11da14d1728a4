"""Load an ``app.py`` and find the one :class:`~pescheduler.plan.app.Application` it describes.

Example::

    from pescheduler.apploader import load_app
    app = load_app("examples/connected_cars.py")

The file is executed as a module under a fresh name registered in
``sys.modules`` and with ``cloudpickle.register_pickle_by_value``: the
lambdas, functions and classes it defines then travel to the workers by value,
so the workers never need to import the app file. (Modules the app imports
are pickled by reference and must be importable on the workers.)

Every failure raises :class:`~pescheduler.errors.AppLoadError` naming the file,
the line when there is one, and the fix, so the command line can print it
without a traceback.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
import sys
import traceback
import types
import uuid

import cloudpickle

from .plan.app import Application
from .errors import AppCheckFailed, AppLoadError, InvalidApplication

MISSING_APP_FIX = ("app.py must define a module-level `app = Application(...)` "
                   "or a function `build()` returning one")


def load_app(path: str | os.PathLike) -> Application:
    """Execute ``path`` and return its Application (module-level, or from ``build()``).

    When the module defines ``build``, it is called and must return the
    Application; otherwise exactly one module-level Application must exist.
    A ``.sql`` file is a query with its sources and sink in comments (docs/sql.md).
    """
    path = os.fspath(path)      # messages show the path as the user gave it
    if path.endswith(".sql"):   # a query naming its sources and sink (pescheduler.sql.sqlfile)
        from .sql.sqlfile import load_sql_app

        return load_sql_app(path)
    module = _execute(path)
    try:
        return _find_application(module, path)
    except BaseException:
        _forget(module)
        raise


def _execute(path: str) -> types.ModuleType:
    """Compile and run the file as a fresh module; syntax and import errors become AppLoadError."""
    code = _compile(path)
    name = "pescheduler_app_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0]) \
        + "_" + uuid.uuid4().hex[:8]
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    cloudpickle.register_pickle_by_value(module)
    try:
        # exec rather than loader.exec_module: no __pycache__ written next to the user's file.
        exec(code, module.__dict__)
    except Exception as exc:
        _forget(module)
        raise _raised_while(path, "importing the app", exc) from None
    return module


def _compile(path: str) -> types.CodeType:
    if not os.path.exists(path):
        raise AppLoadError(path, "no such file", "give the path of a Python file that describes an "
                                                 "Application, e.g. examples/connected_cars.py")
    if os.path.isdir(path):
        raise AppLoadError(path, "is a directory, not a Python file", "give the path of the app's .py file")
    with open(path, "rb") as f:
        source = f.read()
    try:
        # The absolute name: tracebacks (also from workers) point at the file from anywhere.
        return compile(source, os.path.abspath(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise _syntax_error(path, exc) from None


def _syntax_error(path: str, exc: SyntaxError) -> AppLoadError:
    """``file:line:col`` (what editors make clickable), the message, the line and a caret."""
    problem = f"SyntaxError: {exc.msg}"
    raw = (exc.text or "").rstrip("\n")
    if raw.strip():
        code = raw.lstrip()
        caret = " " * max((exc.offset or 1) - 1 - (len(raw) - len(code)), 0)
        problem += f"\n    {code}\n    {caret}^"
    return AppLoadError(path, problem, "correct the syntax on that line",
                        exc.lineno, exc.offset)


def _raised_while(path: str, doing: str, exc: BaseException) -> AppLoadError:
    """AppLoadError at the deepest line of the app file in ``exc``'s traceback."""
    full, line = os.path.abspath(path), None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == full:
            line = lineno
    problem = f"{doing} raised {type(exc).__name__}: {exc}"
    if line:
        problem += f"\n    {linecache.getline(full, line).strip()}"
    fix = f"correct that line (`python {path}` shows the full traceback)"
    return AppLoadError(path, problem, fix, line)


def _find_application(module: types.ModuleType, path: str) -> Application:
    build = getattr(module, "build", None)
    if callable(build):
        return _call_build(build, path)
    found: dict[int, list[str]] = {}
    for name, value in vars(module).items():
        if isinstance(value, Application):
            found.setdefault(id(value), []).append(name)   # one app bound to two names is one app
    if not found:
        raise AppLoadError(path, "no Application found", MISSING_APP_FIX)
    if len(found) > 1:
        names = ", ".join(" = ".join(names) + f" = Application({getattr(module, names[0]).name!r})"
                          for names in found.values())
        raise AppLoadError(path, f"several Applications found: {names}",
                           "define a function `build()` that returns the one to deploy")
    return getattr(module, next(iter(found.values()))[0])


def _call_build(build, path: str) -> Application:
    try:
        app = build()
    except Exception as exc:
        raise _raised_while(path, "build()", exc) from None
    if not isinstance(app, Application):
        line = getattr(getattr(build, "__code__", None), "co_firstlineno", None)
        raise AppLoadError(path, f"build() returned {type(app).__name__}, not an Application",
                           "make build() end with `return app` where app = Application(...)", line)
    return app


def _forget(module: types.ModuleType) -> None:
    """Undo the registration of a module whose loading failed."""
    cloudpickle.unregister_pickle_by_value(module)
    sys.modules.pop(module.__name__, None)


def check_app(app: Application, plugins, path: str | os.PathLike | None = None) -> None:
    """Resolve and check every operator of ``app`` now, before any cluster starts.

    The pre-flight check of both ways in, the command line and
    ``pescheduler.deploy()``: the compiler's own ``validate`` phase runs
    (unknown operators with the names that exist, bad parameters, the graph's
    shape) and its error becomes an :class:`AppCheckFailed` at the file and line
    that added the operator (``path`` as the user gave it, when that is the file).
    """
    from .plan.compiler import CompileContext, validate

    try:
        validate(app, CompileContext(plugins, (), {}))
    except InvalidApplication as exc:
        node = app.nodes.get(str(exc).split(":", 1)[0])
        fix = ("use one of the names listed, or load the plug-in that provides it (--plugin MODULE; "
               "deploy(..., plugins=[MODULE]) in Python)" if "unknown " in str(exc) else "correct that line")
        raise _at_node(app, node, path, str(exc), fix) from None
    _check_requirements(app, plugins, path)


def _check_requirements(app: Application, plugins, path: str | os.PathLike | None) -> None:
    """Every operator's and aggregate's declared libraries importable here (``requires``), else the
    pip command."""
    from .requirements import problem

    for node in app.nodes.values():
        for kind, name, declares in _declaring(node, plugins):
            lacking = problem(kind, name, declares)
            if lacking is not None:
                raise _at_node(app, node, path, f"{node.op_id}: {lacking[0]}", lacking[1])


def _declaring(node, plugins) -> list[tuple[str, str, object]]:
    """``node``'s operator class and the aggregates it computes (``aggregates=`` or ``queries=``)."""
    from .aggregates import reached

    found = [(node.kind, node.name, plugins.operators[(node.kind, node.name)])]
    queries = node.params.get("queries")
    requests = [node.params.get("aggregates"), *(queries.values() if isinstance(queries, dict) else ())]
    for agg in reached({f"{i}.{out}": spec for i, request in enumerate(requests) if isinstance(request, dict)
                        for out, spec in request.items()}, plugins.aggregates):
        found.append(("aggregate", agg.name, agg))
    return found


def _at_node(app: Application, node, path: str | os.PathLike | None, problem: str, fix: str) -> AppCheckFailed:
    """AppCheckFailed at the file and line that added ``node`` (the app as a whole without one)."""
    file, line = node.where if node is not None and node.where else (path and os.fspath(path), None)
    if path is not None and file and os.path.abspath(path) == file:
        file = os.fspath(path)          # messages show the path as the user gave it
    code = linecache.getline(os.path.abspath(file), line).strip() if file and line else ""
    return AppCheckFailed(file or f"application {app.name!r}", problem + (f"\n    {code}" if code else ""),
                          fix, line)
