"""Embedded workers forked from one process that has already imported distributed and pescheduler.

Why: a ``dask worker`` started by command line spends most of its start-up
importing distributed, and again importing pescheduler when its first PE
arrives: about a CPU-second each, times the number of workers, on every
``deploy``. Here one *fork server* process imports them once; each worker is
a fork of it that runs ``dask worker``'s own ``main`` with the arguments,
environment, working directory and ``sys.path`` the deploying process has at
that moment, exactly what the command line gave.

The server holds nothing but those imports, so one serves every embedded
cluster a process starts (:func:`shared`): a script, notebook or test run that
deploys again does not pay the imports again (about a second of wall time and
a CPU-second per ``deploy``). It is stopped by PID when that process exits.

Why not multiprocessing's ``forkserver``: its children unpickle their
preparation data, which re-runs the deploying script's ``__main__`` (the
reason :mod:`pescheduler.control.cluster` does not use ``LocalCluster``).

The server is single-threaded (nothing it imports starts a thread; a fork is
then safe) and is started in its own session, like the workers, so a
terminal's Ctrl-C reaches only the deploying process. It exits when the
deploying process closes its end of the socket, or dies. Each worker comes
back as a :class:`ForkedPopen`: a ``pidfd`` (signals and liveness cannot hit
a recycled PID) and a pipe on which the server writes its exit code once it
has reaped it, so :class:`~pescheduler.resource_managers.processes.Process`
stops it by PID as any other process.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

from .. import allocator

# What a worker imports to start and to run its first PE, imported once in the server: a forked
# worker imported the rest itself, each one after its fork, on the way to its first output. Beside
# the worker's command and the PE host: its HTTP server's routes (``distributed.worker.http.routes``,
# imported as the server starts: prometheus_client and tornado's asyncio platform with them) and
# pescheduler's own plug-in modules (its entry points, loaded at a worker's first PE). Those two
# were about 45 ms of CPU in every worker (issue 34); test_forkserver_preload keeps the list whole.
PRELOAD = ("distributed.cli.dask_worker", "distributed.http.worker.prometheus", "distributed.http.health",
           "distributed.http.statics", "tornado.platform.asyncio", "pescheduler", "pescheduler.worker.pehost",
           "pescheduler.operators", "pescheduler.resource_managers", "pescheduler.policies.copy",
           "pescheduler.policies.move", "pescheduler.policies.rate", "pescheduler.policies.threshold")
_STATUS = struct.Struct("i")
_MAX_REQUEST = 1 << 20
UNKNOWN_EXIT = 255        # the server was gone before it could reap the worker
# Not ``-m``: running this module as ``__main__`` would import it twice.
_LAUNCH = "import sys; from pescheduler.control.forkserver import serve; serve(int(sys.argv[1]))"


class ForkServer:
    """One fork server process; :meth:`spawn` forks a ``dask worker`` from it."""

    def __init__(self, log_path: str, preload: dict[str, str] | None = None) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.preload = preload or {}        # the allocator its forks run on (pescheduler/allocator.py)
        with open(log_path, "ab") as log, theirs:
            self._server = subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **self.preload})
        self._lock = threading.Lock()

    def spawn(self, args: list[str], stderr_path: str) -> ForkedPopen:
        """Fork ``dask worker ARGS``: stdout is this process's, stderr appends to ``stderr_path``."""
        request = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd(),
                              "sys_path": [p for p in sys.path if p]}).encode()
        with open(stderr_path, "ab") as log, self._lock:
            socket.send_fds(self._sock, [request], [1, log.fileno()])     # fd 1: what Popen would inherit
            reply, fds, _, _ = socket.recv_fds(self._sock, 4096, 2)
        if not reply:
            raise RuntimeError(f"the embedded cluster's fork server exited ({self._server.wait()})")
        return ForkedPopen(args, json.loads(reply)["pid"], *fds)

    def alive(self) -> bool:
        return self._server.poll() is None

    def close(self) -> None:
        """Stop the server by its PID and reap it. It holds nothing but imports (its forked workers
        are stopped by their owner, by PID, in their own sessions), so SIGTERM ends it at once:
        waiting for it to see the socket close would wait out its preload when it is still
        importing (a deploy that failed on a broken app) and its interpreter's shut-down. The server
        exits 0 on it (:func:`_exit_now`)."""
        self._sock.close()
        if self._server.poll() is None:
            self._server.terminate()
        try:
            self._server.wait(10)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()


_shared: tuple[ForkServer, str] | None = None      # this process's server and its log folder
_shared_lock = threading.Lock()


def prestart(argv: list[str]) -> None:
    """Start this process's server now when ``argv`` (``python -m pescheduler``'s) deploys on an
    embedded cluster: its imports (about 0.6 s) then run on another core while this process
    imports the control plane and loads the app, instead of after. A deploy that fails before
    its cluster starts (a broken app, exit 2) stops it at exit, by PID, as always."""
    if argv[:1] == ["deploy"] and not any(a == "--cluster" or a.startswith("--cluster=") for a in argv) \
            and not any(a in ("-h", "--help") for a in argv):
        shared()


def shared() -> ForkServer:
    """This process's fork server, started on first use (or again if it died, or if
    ``pescheduler.pe.allocator`` changed since: its forks inherit its allocator) and stopped at exit."""
    global _shared
    preload = allocator.preload_env()
    with _shared_lock:
        if _shared is None or not _shared[0].alive() or _shared[0].preload != preload:
            _close_shared()
            folder = tempfile.mkdtemp(prefix="pescheduler-forkserver-")
            _shared = (ForkServer(os.path.join(folder, "forkserver.log"), preload), folder)
        return _shared[0]


@atexit.register
def _close_shared() -> None:
    """At exit (and before a replacement): the server stopped by its PID, its log folder removed."""
    global _shared
    if _shared is not None:
        server, folder = _shared
        _shared = None
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


def _forget_in_child() -> None:
    """A forked copy of a deploying process starts its own server: the parent's socket is closed
    here (the parent's server must see EOF when the parent exits), its process left alone."""
    global _shared, _shared_lock
    _shared_lock = threading.Lock()          # another thread may have held it at the fork
    if _shared is not None:
        _shared[0]._sock.close()
        _shared = None


os.register_at_fork(after_in_child=_forget_in_child)


class ForkedPopen:
    """The part of :class:`subprocess.Popen` a :class:`~pescheduler.resource_managers.processes.Process`
    uses, for a worker forked by the server (a grandchild: this process cannot ``waitpid`` it)."""

    def __init__(self, args: list[str], pid: int, pidfd: int, status_fd: int) -> None:
        self.args, self.pid, self.returncode = args, pid, None
        self._pidfd, self._status_fd = pidfd, status_fd

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._reap()
        return self.returncode

    def _reap(self) -> None:
        # Exited: the server writes the code as soon as it has reaped it (EOF if the server is gone).
        select.select([self._status_fd], [], [], 5.0)
        data = os.read(self._status_fd, _STATUS.size) if select.select([self._status_fd], [], [], 0)[0] else b""
        self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else UNKNOWN_EXIT
        os.close(self._pidfd)
        os.close(self._status_fd)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ---- the server process ----

def serve(fd: int) -> None:
    """The server's main loop on the socket ``fd``: fork a worker per request, report each one's exit."""
    from setproctitle import setproctitle

    setproctitle(f"{sys.executable} -m pescheduler.control.forkserver (embedded workers of {os.getppid()})")
    # close() stops the server with SIGTERM, even half-way through its imports: it exits at once,
    # cleanly (0), without the interpreter's shut-down of everything it imported.
    signal.signal(signal.SIGTERM, _exit_now)
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        __import__(name)
    assert threading.active_count() == 1, f"a preloaded module started a thread: {threading.enumerate()}"
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status_w: dict[int, int] = {}          # pid -> write end of its status pipe
    while True:
        ready = select.select([sock, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap_children(status_w)
        if sock in ready:
            request, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 2)
            if not request:                # the deploying process closed its end, or died:
                _exit_now(0, None)         # at once, as on SIGTERM: an interpreter's shut-down resets
                                           # SIGTERM to its default, and close() sends one meanwhile
            sys.stdout.flush()
            sys.stderr.flush()
            status_r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                _worker(json.loads(request), fds)          # never returns
            status_w[pid] = w
            pidfd = os.pidfd_open(pid)     # before any reaping: the PID cannot have been recycled
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd, status_r])
            for fd in (*fds, pidfd, status_r):
                os.close(fd)
            _reap_children(status_w)


def _exit_now(signum, frame) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _reap_children(status_w: dict[int, int]) -> None:
    while status_w:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        w = status_w.pop(pid, None)
        if w is not None:
            os.write(w, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(w)


def _worker(request: dict, fds: list[int]) -> None:
    """In the forked child: become what ``python -m distributed.cli.dask_worker ARGS`` would be."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)      # the server's own handler is not the worker's
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))       # as Popen's close_fds
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = [*request["sys_path"], *(p for p in sys.path if p not in request["sys_path"])]
        import tempfile

        import dask.config

        from .. import config
        tempfile.tempdir = None            # TMPDIR may differ from the server's
        dask.config.refresh()              # DASK_* and PESCHEDULER__* as of this request
        config.apply_env()
        from distributed.cli.dask_worker import main

        sys.argv = [main.name, *request["args"]]   # the title ps shows is distributed's: dask worker [ADDRESS]
        main.main(args=request["args"], prog_name="dask worker")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
