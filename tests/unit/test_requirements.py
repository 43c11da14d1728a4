"""A plug-in's declared libraries are checked before any worker starts (issue 36, item 3).

``pip install -e .`` does not install pyarrow, yet ``parquet`` is built in: without the check the app
started and every checkpoint aborted on the workers. Here pyarrow is made absent by a ``sys.meta_path``
finder that refuses it, in a fresh interpreter running the real command line: what ``find_spec`` and
``import`` see is then what they see in a venv without it, and the test needs no second copy of every
dependency (a fresh venv would need dask, distributed, bokeh... as wheels, which a CI machine may not
have cached). The finder also fails the run if anything imports pyarrow anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pescheduler import Application
from pescheduler.apploader import check_app
from pescheduler.errors import AppCheckFailed
from pescheduler.plugins import load_plugins
from pescheduler.requirements import missing, pip_command

BLOCKER = textwrap.dedent("""
    import sys

    class NoModule:
        '''Refuses MODULE as an environment without it does.'''
        def find_spec(self, name, path=None, target=None):
            if name == "MODULE" or name.startswith("MODULE."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoModule())
    from pescheduler.cli import main
    sys.exit(main(sys.argv[1:]))
""")

APP = textwrap.dedent("""
    from pescheduler import Application

    app = Application("lake")
    (app.source("iterable", items=[{"ts": 1, "v": 1}])
        .sink("parquet", path=OUT))
""")


def test_a_missing_library_exits_2_with_the_pip_command_before_any_worker(tmp_path):
    (tmp_path / "app.py").write_text(APP.replace("OUT", repr(str(tmp_path / "out"))))
    run = subprocess.run([sys.executable, "-c", BLOCKER.replace("MODULE", "pyarrow"), "deploy", str(tmp_path / "app.py"), "--workers", "2"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")})
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{tmp_path / 'app.py'}:6: parquet-2: sink 'parquet' needs pyarrow, which is not installed" \
        in run.stderr, run.stderr
    assert 'fix: pip install "pescheduler[columnar]"' in run.stderr
    assert "deploying" not in run.stdout          # said before the cluster starts
    assert not (tmp_path / "state").exists() and not (tmp_path / "out").exists()


SKETCH_APP = textwrap.dedent("""
    from pescheduler import Application

    app = Application("latency")
    (app.source("generator", events=1_000, keys=10)
        .key_by("car")
        .window(size="1s", aggregates={"p99": ("approx_percentile", "speed", 0.99)})
        .sink("jsonl", path=OUT))
""")


def test_an_aggregate_missing_its_library_exits_2_with_the_pip_command_before_any_worker(tmp_path):
    """The sketch aggregates import datasketches on the workers only: without it every window
    failed there; now the deploy says so first, naming the aggregate and the extra."""
    (tmp_path / "app.py").write_text(SKETCH_APP.replace("OUT", repr(str(tmp_path / "out.jsonl"))))
    run = subprocess.run([sys.executable, "-c", BLOCKER.replace("MODULE", "datasketches"), "deploy",
                          str(tmp_path / "app.py"), "--workers", "2"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={**os.environ, "PESCHEDULER__STATE_DIR": str(tmp_path / "state")})
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"{tmp_path / 'app.py'}:7: window-3: aggregate 'approx_percentile(0.99)' needs datasketches, "
            f"which is not installed") in run.stderr, run.stderr
    assert 'fix: pip install "pescheduler[sketches]"' in run.stderr
    assert "deploying" not in run.stdout and not (tmp_path / "out.jsonl").exists()


def test_a_plug_in_aggregate_declares_what_it_needs_and_a_derived_one_inherits_it():
    from pescheduler.aggregates import Aggregate

    base = Aggregate("tdigest36", create=list, update=lambda a, v: a + [v], merge=lambda a, b: a + b,
                     requires=("no_such_module_36",), install="pescheduler[extra36]")
    median = Aggregate("median36", uses=(base,), result=lambda a: a)
    app = Application("needs")
    app.source("iterable", items=[1]).key_by("k").window(size="1s", aggregates={"m": (median, "v")}) \
        .sink("print")
    with pytest.raises(AppCheckFailed) as err:
        check_app(app, load_plugins())
    assert "window-3: aggregate 'tdigest36' needs no_such_module_36" in str(err.value)
    assert err.value.fix == 'pip install "pescheduler[extra36]"'


class NeedsTwo:
    requires = ("json", "no_such_module_36", "nor_this_one_36")


def test_only_what_is_missing_is_named_and_installed():
    assert missing(NeedsTwo) == ["no_such_module_36", "nor_this_one_36"]
    assert pip_command(NeedsTwo, missing(NeedsTwo)) == "pip install no_such_module_36 nor_this_one_36"


def test_deploy_checks_requirements_in_python_too(monkeypatch):
    found = load_plugins()
    sink = found.operators[("sink", "print")]
    monkeypatch.setattr(sink, "requires", ("no_such_module_36",), raising=False)
    monkeypatch.setattr(sink, "install", "pescheduler[extra36]", raising=False)
    app = Application("needs")
    app.source("iterable", items=[1]).sink("print")
    with pytest.raises(AppCheckFailed) as err:
        check_app(app, found)
    assert "print-2: sink 'print' needs no_such_module_36" in str(err.value)
    assert err.value.fix == 'pip install "pescheduler[extra36]"'


def test_a_policy_module_declares_what_it_needs_too(monkeypatch):
    from pescheduler.control.controller import UnknownPolicyError, select_policies

    found = load_plugins()
    rate = found.policies()["rate"]
    monkeypatch.setattr(rate, "requires", ("no_such_module_36",), raising=False)
    with pytest.raises(UnknownPolicyError, match=r"policy 'rate' needs no_such_module_36, which is not "
                                                 r"installed: pip install no_such_module_36"):
        select_policies(found, ["rate"])
    assert list(select_policies(found, ["copy"])) == ["copy"]
