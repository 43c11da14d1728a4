"""Each worker process's directory of a deployment, and the end of a deployment on one of them."""

from __future__ import annotations

import os
import subprocess
import sys

import dask.config
import pytest

from pescheduler.errors import ConfigError
from pescheduler.state.settings import (_name_of, check_state_dir, deployment_dir, machine_dir, remove_stores,
                                        store_dir)


@pytest.fixture
def state_dir(tmp_path):
    with dask.config.set({"pescheduler.state.dir": str(tmp_path)}):
        yield tmp_path


@pytest.fixture
def other_process():
    """Another live process of this machine (stopped by its PID after the test)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_process_has_a_directory_of_its_own_named_by_its_pid_and_start(state_dir, other_process):
    mine = deployment_dir("d")
    assert os.path.dirname(mine) == machine_dir("d") == os.path.join(state_dir, "pescheduler-state", "d")
    assert os.path.basename(mine) == _name_of(os.getpid())
    assert _name_of(other_process.pid) != os.path.basename(mine)
    assert os.path.dirname(store_dir("op", "d")) == mine


def test_the_end_of_a_deployment_here_removes_this_processs_and_ended_ones_not_a_live_ones(state_dir, other_process):
    """A worker's end of the deployment removes its own stores and those a SIGKILLed worker left;
    another live worker's (sharing the machine's state directory) stay."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    gone_pid = int(ended.stdout)
    own = store_dir("op", "d")
    live = os.path.join(machine_dir("d"), _name_of(other_process.pid), "op-store")
    host = _name_of(os.getpid()).split("-", 2)[2]
    dead = os.path.join(machine_dir("d"), f"p{gone_pid}-1-{host}", "op-store")    # its start: no live process's
    other = os.path.join(machine_dir("d"), "notes")                           # not a process's: left alone
    elsewhere = os.path.join(machine_dir("d"), f"p{gone_pid}-1-another-machine", "op-store")   # a shared dir
    for path in (live, dead, other, elsewhere):
        os.makedirs(path)
    remove_stores("d")
    assert not os.path.exists(own) and not os.path.exists(deployment_dir("d"))
    assert not os.path.exists(os.path.dirname(dead))
    assert os.path.isdir(live) and os.path.isdir(other) and os.path.isdir(elsewhere)


def test_the_last_worker_of_a_deployment_here_leaves_no_directory_of_it(state_dir):
    store_dir("op", "d")
    remove_stores("d")
    assert not os.path.exists(machine_dir("d"))
    remove_stores("d")                  # again, and with nothing there: no error


def test_a_state_dir_that_cannot_be_made_is_a_config_error_naming_the_key(tmp_path):
    """Checked before an embedded cluster's workers start (``deploy``), and said the same way by a
    worker whose own setting it is (its first store)."""
    (tmp_path / "a-file").write_text("")
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "a-file")}):
        with pytest.raises(ConfigError, match=r"pescheduler.state.dir: .*a-file/pescheduler-state .*NotADirectoryError"):
            check_state_dir()
        with pytest.raises(ConfigError, match="pescheduler.state.dir: .*NotADirectoryError"):
            store_dir("op", "d")
    with dask.config.set({"pescheduler.state.dir": str(tmp_path / "new" / "dir")}):
        check_state_dir()                   # made when missing, owner-only
    assert oct((tmp_path / "new" / "dir" / "pescheduler-state").stat().st_mode & 0o777) == "0o700"
