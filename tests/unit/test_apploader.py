"""load_app: a good app loads and ships by value; every mistake names file, line and fix."""

from __future__ import annotations

import pickle
import sys
import textwrap

import cloudpickle
import pytest

from pescheduler import Application
from pescheduler.apploader import MISSING_APP_FIX, load_app
from pescheduler.errors import AppLoadError

HEADER = "from pescheduler import Application\n"


def write(tmp_path, body: str, name: str = "app.py"):
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def load_error(path) -> AppLoadError:
    with pytest.raises(AppLoadError) as err:
        load_app(path)
    return err.value


def app_modules() -> set[str]:
    return {name for name in sys.modules if name.startswith("pescheduler_app_")}


def test_module_level_app_loads(tmp_path):
    path = write(tmp_path, """
        app = Application("cars")
        app.source("iterable", items=[1, 2]).sink("print")
    """)
    app = load_app(path)
    assert isinstance(app, Application) and app.name == "cars"
    assert list(app.nodes) == ["iterable-1", "print-2"]


def test_build_function_is_called(tmp_path):
    path = write(tmp_path, """
        def build():
            app = Application("built")
            app.source("iterable", items=[1]).sink("print")
            return app
    """)
    assert load_app(str(path)).name == "built"


def test_one_app_bound_to_two_names_is_one_app(tmp_path):
    path = write(tmp_path, 'app = Application("one")\nalias = app\n')
    assert load_app(path).name == "one"


def test_functions_of_the_app_ship_by_value(tmp_path):
    """A module-level function pickles by value, so workers need not import app.py."""
    path = write(tmp_path, """
        def double(t):
            return 2 * t

        app = Application("fns")
        app.source("iterable", items=[1]).map(double).sink("print")
    """)
    fn = load_app(path).nodes["map-2"].params["fn"]
    blob = cloudpickle.dumps(fn)
    del sys.modules[fn.__module__]          # as on a worker that never saw the file
    assert pickle.loads(blob)(21) == 42


def test_each_load_is_a_fresh_module(tmp_path):
    path = write(tmp_path, 'app = Application("again")\n')
    first, second = load_app(path), load_app(path)
    assert first is not second


def test_missing_file(tmp_path):
    err = load_error(tmp_path / "nope.py")
    assert "nope.py" in str(err) and "no such file" in str(err)
    assert err.fix


def test_directory_is_not_an_app(tmp_path):
    assert "is a directory" in str(load_error(tmp_path))


def test_syntax_error_names_file_line_column_and_the_line(tmp_path):
    path = write(tmp_path, "x = 1\ndef broken(:\n    pass\n")
    err = load_error(path)
    assert f"{path}:3:12: SyntaxError" in str(err)
    assert "def broken(:" in str(err)
    assert (err.line, err.column) == (3, 12)


def test_exception_while_importing_names_the_app_line(tmp_path):
    path = write(tmp_path, 'app = Application("x")\nlimits = {}\nlimit = limits["speed"]\n')
    err = load_error(path)
    assert str(err).startswith(f"{path}:4: importing the app raised KeyError: 'speed'")
    assert 'limit = limits["speed"]' in str(err)
    assert f"python {path}" in err.fix


def test_bad_operator_parameters_point_at_the_app_line(tmp_path):
    path = write(tmp_path, 'app = Application("x")\napp.source("iterable", itemz=[1])\n')
    err = load_error(path)
    assert err.line == 3 and "InvalidApplication" in str(err) and "itemz" in str(err)


def test_failed_load_leaves_no_module_behind(tmp_path):
    before = app_modules()
    load_error(write(tmp_path, "raise RuntimeError('no')\n"))
    load_error(write(tmp_path, "x = 1\n", name="empty.py"))
    assert app_modules() == before


def test_no_application(tmp_path):
    path = write(tmp_path, "x = 1\n")
    err = load_error(path)
    assert str(path) in str(err) and "no Application found" in str(err)
    assert err.fix == MISSING_APP_FIX


def test_several_applications_are_named(tmp_path):
    path = write(tmp_path, 'a = Application("first")\nb = Application("second")\n')
    message = str(load_error(path))
    assert "a = Application('first')" in message and "b = Application('second')" in message
    assert "build()" in message


def test_build_returning_something_else(tmp_path):
    path = write(tmp_path, "\ndef build():\n    return 42\n")
    err = load_error(path)
    assert err.line == 3 and "build() returned int, not an Application" in str(err)


def test_exception_inside_build_names_the_deepest_app_line(tmp_path):
    path = write(tmp_path, """
        def check(app):
            raise ValueError("bad app")

        def build():
            app = Application("x")
            check(app)
            return app
    """)
    err = load_error(path)
    assert err.line == 4 and "build() raised ValueError: bad app" in str(err)


def test_error_pickles_with_its_parts():
    err = AppLoadError("app.py", "no Application found", "define app", 7)
    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.line, again.fix) == (str(err), 7, "define app")
