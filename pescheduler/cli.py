"""The command line: ``python -m pescheduler deploy | status | stop | list | plugins``.

Example::

    python -m pescheduler deploy examples/connected_cars.py --workers 4 --name cars
    python -m pescheduler status cars     # from another terminal
    python -m pescheduler stop cars

Exit status: 0 when the app finished or was stopped, 1 when it failed (or no
deployment was found, or a cluster was unreachable), 2 for a mistake in the
app, its configuration, a ``--plugin`` module or the command line, reported
before any worker starts (the message names the fix; no traceback), 130 on Ctrl-C,
143 on SIGTERM (both drain and stop everything the deployment started first).
"""

from __future__ import annotations

import argparse
import os
import json
import logging
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__, config
from .control import statefile
from .control.topics import command_topic, state_topic
from .errors import (AppLoadError, CheckpointError, ConfigError, DeploymentClash, DeploymentFailed,
                     InvalidApplication, NotReplayable)
from .liveview import LiveView, dead_letter_lines, format_event, format_line, new_events, render
from .plugins import PluginError, Plugins, UnknownOperatorError, internal, load_plugins
from .suggest import did_you_mean

USER_ERRORS = (AppLoadError, InvalidApplication, UnknownOperatorError, ConfigError, PluginError, CheckpointError,
               NotReplayable, DeploymentClash)
RUNNING = ("starting", "running")
PIPE_WIDTH = 200      # tables written to a pipe are not wrapped at 80 columns
STOP_TIMEOUT_S = 60.0  # how long `stop` (default) and `deploy --replace` wait for a deployment to stop
START_POLL_S = 0.02   # how often `status`/`stop` look for the record of a deployment still starting
STOP_CHECK_S = 0.25   # `stop` reads the status this often besides waiting for the deployment's state event
NARROW = 80           # `status` and `plugins` fit this off a terminal (a terminal: its own width)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (the console script exits with it)."""
    args = parser().parse_args(argv)
    try:
        with _sigterm_as_interrupt():
            return args.run(args)
    except Terminated:
        return 143
    except KeyboardInterrupt:
        return 130


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager, ``kill``): handled as Ctrl-C is (drain, flush, stop what was started)."""


def end_without_teardown(code: int) -> None:
    """End this process with ``code`` as ``sys.exit`` would, less the interpreter's teardown of
    every module it imported (dask's among them): `stop` spent 40-150 ms there, a third of its
    imports again, on its way to its exit (issue 34: 0.3 s). Its atexit handlers still run and
    its output is flushed; it holds no child and, on the socket's path, no other thread. A
    process with another thread alive (the scheduler's path: a client's) exits as usual."""
    import atexit
    if threading.active_count() > 1 or not hasattr(atexit, "_run_exitfuncs"):
        sys.exit(code)
    atexit._run_exitfuncs()          # what the interpreter runs before its teardown
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: nothing more to say there
            pass
    os._exit(code)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` in the main thread; Python's default would exit at once,
    leaving worker processes and Spark JVMs started in their own sessions behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # one is enough: a second must not cut the stop short
        raise Terminated()
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="pescheduler", description="Stream processing on Dask.")
    top.add_argument("--version", action="version", version=f"pescheduler {__version__}")
    sub = top.add_subparsers(title="commands", required=True, metavar="COMMAND")

    dep = sub.add_parser("deploy", help="run an app and show it live until it ends")
    dep.add_argument("app", help="Python file defining `app = Application(...)` or `build()`")
    where = dep.add_mutually_exclusive_group()
    where.add_argument("--cluster", metavar="ADDR", help="scheduler of a running Dask cluster")
    where.add_argument("--workers", type=_at_least_one, metavar="N",
                       help="worker processes of the embedded cluster (default: pescheduler.cluster.workers)")
    dep.add_argument("--rm", metavar="NAME", help="resource manager (local, lab, spark, none)")
    dep.add_argument("--policy", action="append", metavar="NAME",
                     help="active policy, repeatable (default: pescheduler.policies.default, rate and copy); "
                          "`--policy none` for none")
    dep.add_argument("--config", metavar="FILE", help="YAML file of pescheduler settings")
    dep.add_argument("--duration", type=_positive, metavar="S", help="stop after S seconds")
    dep.add_argument("--checkpoint", nargs="?", const=True, metavar="URL",
                     help="take checkpoints to this directory or fsspec URL (alone: the default directory); "
                          "a lost worker then restores the last one (docs/checkpoints.md)")
    dep.add_argument("--checkpoint-interval", metavar="DURATION", help="time between checkpoints (default 1s)")
    dep.add_argument("--restore", metavar="latest|ID", help="start from this checkpoint of --checkpoint's storage")
    dep.add_argument("--latency", type=_duration, metavar="DURATION",
                     help="latency target the channels size their batches by (default: pescheduler.batch.latency, "
                          "1ms; 0: never wait; docs/latency.md)")
    dep.add_argument("--state", choices=("memory", "disk"),
                     help="where KEYED operators keep keyed state (default: pescheduler.state.backend; docs/state.md)")
    _plugin_option(dep)
    _tls_options(dep)
    dep.add_argument("--json", action="store_true", help="one JSON status per line instead of the view")
    dep.add_argument("--explain", action="store_true",
                     help="print the operators and the PE placement on --workers (default 1) and exit")
    dep.add_argument("--name", metavar="N", help="name `status N` and `stop N` use (default: the app's name)")
    clash = dep.add_mutually_exclusive_group()
    clash.add_argument("--replace", action="store_true",
                       help="stop the deployment running under this name first, then deploy")
    clash.add_argument("--suffix", action="store_true",
                       help="when this name runs, deploy as NAME-2 (NAME-3...) instead of exiting 2")
    dep.set_defaults(run=cmd_deploy)

    status = sub.add_parser("status", help="placement, rates, busy/backpressure per PE")
    _target(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON (docs/status.md)")
    status.add_argument("--wide", action="store_true", help="every column (hosts too), wider than 80")
    status.add_argument("--dead-letters", type=int, default=0, metavar="N",
                        help="also print the newest N dead letters: exception, the app's line, the tuple")
    _tls_options(status)
    status.set_defaults(run=cmd_status)

    stop = sub.add_parser("stop", help="drain sources, flush sinks, stop")
    _target(stop)
    stop.add_argument("--timeout", type=_positive, default=STOP_TIMEOUT_S, metavar="S",
                      help="how long to wait for the deployment to confirm (default 60)")
    _tls_options(stop)
    stop.set_defaults(run=cmd_stop)

    listing = sub.add_parser("list", help="the embedded deployments running on this machine (--cluster: there)")
    listing.add_argument("--cluster", metavar="ADDR", help="the deployments on the cluster of this scheduler")
    _tls_options(listing)
    listing.set_defaults(run=cmd_list, name=None)

    plugins = sub.add_parser("plugins", help="operators, aggregates, policies, resource managers found")
    _plugin_option(plugins)
    plugins.add_argument("--describe", metavar="NAME",
                         help="the parameters of this operator, source, sink, aggregate or policy")
    plugins.add_argument("--all", action="store_true", help="also the ep planner's internal ep_* operators")
    plugins.set_defaults(run=cmd_plugins)
    return top


def _plugin_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="also load this plug-in module, repeatable")


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="the deployment's name (`list` shows them; needed when several run)")
    p.add_argument("--cluster", metavar="ADDR", help="scheduler address of a deployment on another cluster")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _tls_options(p: argparse.ArgumentParser) -> None:
    """Dask's own TLS flags; the same certificates also secure the PE data plane (docs/security.md)."""
    tls = p.add_argument_group("TLS (as `dask scheduler`/`dask worker`; all three, or none)")
    tls.add_argument("--tls-ca-file", metavar="PATH", help="CA certificate(s) of the cluster")
    tls.add_argument("--tls-cert", metavar="PATH", help="certificate of this process (and of an embedded cluster)")
    tls.add_argument("--tls-key", metavar="PATH", help="private key of --tls-cert")


def _security(args: argparse.Namespace):
    """A ``distributed.Security`` from the TLS flags (every role: an embedded cluster uses it too), or None."""
    files = {"--tls-ca-file": args.tls_ca_file, "--tls-cert": args.tls_cert, "--tls-key": args.tls_key}
    if not any(files.values()):
        return None
    missing = [flag for flag, path in files.items() if not path or not os.path.isfile(path)]
    if missing:
        raise SystemExit(_fail(_console(stderr=True), f"TLS needs --tls-ca-file, --tls-cert and --tls-key, "
                                                      f"each an existing file: check {', '.join(missing)}", 2))
    from distributed import Security

    roles = {f"tls_{role}_{kind}": path for role in ("client", "scheduler", "worker")
             for kind, path in (("cert", args.tls_cert), ("key", args.tls_key))}
    return Security(tls_ca_file=args.tls_ca_file, require_encryption=True, **roles)


def _positive(text: str) -> float:
    """Seconds for ``--duration``/``--timeout``: longer than 0, finite (``nan`` never ends a run)."""
    try:
        return config.positive_seconds(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    """Seconds for ``--latency``: 0 or more, finite."""
    try:
        return config.seconds(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _console(stderr: bool = False, width: int | None = None) -> Console:
    probe = Console(stderr=stderr)
    # markup off: app names, paths and error texts may hold [brackets] rich would eat.
    return Console(stderr=stderr, highlight=False, markup=False,
                   width=None if probe.is_terminal else width or PIPE_WIDTH)


def _fail(console: Console, message: str, code: int) -> int:
    console.print(Text(message, style="red"), soft_wrap=True)
    return code


# -- deploy -------------------------------------------------------------------------------

def cmd_deploy(args: argparse.Namespace) -> int:
    """Check config, plug-ins and app; deploy; follow until the end; stop in any case.

    The control plane (distributed, about 0.4 s) is imported once the app has loaded and passed
    its checks: a broken app fails (exit 2) without waiting for it. An embedded cluster's fork
    server started with the command (``__main__``) and imports meanwhile; it is stopped at exit."""
    out, err = _console(), _console(stderr=True)
    info = err if args.json else out        # --json keeps stdout pure JSON lines
    options = _later_options(args)
    try:
        app = _prepare(args)
        if args.explain:                    # EXPLAIN: the planner's placement, nothing started
            from .sql import explain_app

            out.print(explain_app(app, args.workers or 1), soft_wrap=True, markup=False, highlight=False)
            return 0
        from .control.deployment import deploy

        if args.cluster:
            _reachable(args.cluster)
        statefile.use_name(args.name)
        replaced = _replace(args, statefile.name_of(app.name), info, err) if args.replace else 0
        if replaced:
            return replaced
        with _ctrl_c_deferred() as ctrl_c:
            info.print(f"deploying {app.name} on {args.cluster or 'an embedded Dask cluster on 127.0.0.1'}…",
                       soft_wrap=True)
            dep = deploy(app, workers=args.workers, cluster=args.cluster, plugins=tuple(args.plugin),
                         name=statefile.name_of(app.name), suffix=args.suffix, **options)
    except USER_ERRORS as exc:
        return _fail(err, str(exc), 2)
    except ClusterUnreachable as exc:
        return _fail(err, str(exc), 1)
    except DeploymentFailed as exc:
        return _fail(err, f"deploy failed: {exc.reason}", 1)
    except TypeError as exc:
        if not options:
            raise
        flags = " and ".join(f"--{'policy' if name == 'policies' else name}" for name in options)
        return _fail(err, f"{flags}: not available in this version ({exc}); deploy without it", 2)
    except OSError as exc:       # includes the connect timeout of an unreachable scheduler
        where = f"reach the cluster at {args.cluster}" if args.cluster else "start the embedded cluster"
        return _fail(err, f"cannot {where}: {exc}", 1)
    embedded = getattr(dep, "cluster", None)
    link = embedded.dashboard_link if embedded is not None and hasattr(embedded, "dashboard_link") else \
        getattr(dep, "dashboard", "")
    page = f"; dashboard {link.replace('/status', '/pescheduler')}" if link else ""
    shown = dep.name if args.suffix else args.name        # --suffix: NAME-2 when NAME runs
    name = f" {shown}" if shown else ""
    info.print(f"running on {dep.scheduler_address}{page}; `python -m pescheduler status{name}` or "
               f"`stop{name}` from another terminal"
               f"{' with --cluster ' + dep.scheduler_address if args.cluster else ''}", soft_wrap=True)
    ckpt = getattr(dep, "checkpoint_settings", None)
    if ckpt is not None:
        info.print(f"checkpoints every {ckpt.interval:g} s in {ckpt.store.url}"
                   + (f", restored from checkpoint {ckpt.restore_id}" if ckpt.restore_id is not None else ""),
                   soft_wrap=True)
    try:
        if ctrl_c.requested:                # Ctrl-C while it started: the clean stop, now
            raise KeyboardInterrupt
        final = _follow(dep, args, out)     # SIGTERM: Terminated from main's handler, drained below
    except DeploymentFailed as exc:
        return _fail(err, f"{app.name} failed: {exc.reason}", 1)
    except KeyboardInterrupt as exc:
        why = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        err.print(f"{why}: draining sources and flushing sinks before stopping…")
        raise
    finally:
        dep.stop()
    if final["state"] in ("failed", "stalled"):
        why = final.get("error") or next((e["text"] for e in reversed(final["events"]) if e["kind"] == "stalled"), "")
        return _fail(err, f"{app.name} {final['state']}: {why}", 1)
    info.print(f"{app.name} {final['state']} after {final['elapsed_s']:.1f} s", soft_wrap=True)
    return 0


def _replace(args: argparse.Namespace, name: str, info: Console, err: Console) -> int:
    """``deploy --replace``: stop the deployment running as ``name`` (here, or on ``--cluster``) and
    wait until its process has released the name; 0 also when none runs."""
    if not _runs(args, name):
        return 0
    info.print(f"--replace: stopping the running {name!r} first…", soft_wrap=True)
    stopped = cmd_stop(argparse.Namespace(name=name, cluster=args.cluster, timeout=STOP_TIMEOUT_S,
                                          tls_ca_file=args.tls_ca_file, tls_cert=args.tls_cert,
                                          tls_key=args.tls_key))
    if stopped == 0 and not args.cluster and not _released(name, STOP_TIMEOUT_S):
        return _fail(err, f"--replace: {name!r} said it stopped, but its process still holds the name "
                          f"after {STOP_TIMEOUT_S:.0f} s", 1)
    return stopped


def _runs(args: argparse.Namespace, name: str) -> bool:
    """A deployment called ``name`` runs embedded here, or on ``--cluster``."""
    if not args.cluster:
        return statefile.read(name) is not None
    with _client(args.cluster, _security(args)) as client:
        return any(s["state"] in RUNNING and name == s.get("name") for s in _deployments(client))


def _released(name: str, timeout: float) -> bool:
    """Wait (bounded) until the process of the embedded deployment ``name`` removed its record and
    claim, as it does last when it stops; another process's files signal nothing, so this polls."""
    deadline = time.monotonic() + timeout
    while statefile.read(name) is not None or statefile.claim_of(name) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _prepare(args: argparse.Namespace):
    """Everything checked before any worker starts: config, plug-ins, settings, the app file; the app."""
    from .apploader import check_app, load_app
    from .plugins import prepare

    if args.config:
        _load_config(args.config)
    found = prepare(args.plugin)    # before the app: its operator and aggregate names may come from them
    app = load_app(args.app)
    check_app(app, found, args.app)
    return app


class ClusterUnreachable(OSError):
    """``--cluster ADDR`` did not answer within ``pescheduler.cluster.connect-timeout``."""


def _reachable(address: str) -> None:
    """Connect to the scheduler once, bounded, so an unreachable one fails fast and by name."""
    import asyncio

    from distributed.comm import connect

    timeout = config.get_seconds("cluster.connect-timeout")

    async def probe() -> None:
        comm = await connect(address, timeout=timeout)
        await comm.close()
    try:
        asyncio.run(probe())
    except (OSError, ValueError, TypeError) as exc:
        raise ClusterUnreachable(f"cannot reach the cluster at {address} within {timeout:g} s "
                                 f"({type(exc).__name__}: {exc}); is its scheduler running?") from None


class CtrlC:
    """Whether Ctrl-C came while ``deploy()`` started the deployment (:func:`_ctrl_c_deferred`)."""

    requested = False


@contextmanager
def _ctrl_c_deferred() -> Iterator[CtrlC]:
    """Acknowledge Ctrl-C while ``deploy()`` starts, and honour it once it has returned.

    Interrupting ``deploy()`` half-way would leave what it had started (the
    embedded cluster, a resource manager's hosts) to half-done cleanup; the
    deployment is stopped cleanly instead, as soon as there is one to stop. Its
    worker processes start in their own sessions, so a terminal's Ctrl-C reaches
    this process alone.
    """
    ctrl_c = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return

    def acknowledge(signum, frame):
        ctrl_c.requested = True
        sys.stderr.write("Ctrl-C: stopping once the cluster is up (it is starting)…\n")
        sys.stderr.flush()
    previous = signal.signal(signal.SIGINT, acknowledge)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)


def _load_config(path: str) -> None:
    import yaml

    try:
        config.load_file(path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None


def _later_options(args: argparse.Namespace) -> dict:
    """``rm=`` and ``policies=`` only when given, so a deploy() without them still works."""
    options: dict = {}
    if args.rm:
        options["rm"] = args.rm
    if args.policy:
        options["policies"] = [] if args.policy == ["none"] else list(args.policy)
    security = _security(args)
    if security is not None:
        options["security"] = security
    for name in ("checkpoint", "checkpoint_interval", "restore", "state", "latency"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return options


def _follow(dep, args: argparse.Namespace, out: Console) -> dict:
    """Show the deployment until it ends (or ``--duration`` passes); returns the final status."""
    if out.is_terminal and not args.json:
        with LiveView(dep.status, console=out):
            return _wait(dep, args.duration, lambda status: None)
    if args.json:
        return _wait(dep, args.duration, lambda status: print(json.dumps(status, default=str), flush=True))
    seen: set = set()

    def log(status: dict) -> None:
        for event in new_events(status, seen):
            print(format_event(event), flush=True)
        print(format_line(status), flush=True)

    return _wait(dep, args.duration, log)


def _wait(dep, duration: float | None, tick: Callable[[dict], None]) -> dict:
    """``dep.wait`` one monitor interval at a time, calling ``tick`` with each status."""
    interval = config.get_seconds("monitor.interval")
    deadline = None if duration is None else time.monotonic() + duration
    while True:
        timeout = interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
        try:
            final = dep.wait(timeout=timeout)
            break
        except TimeoutError:
            tick(dep.status())
        if deadline is not None and time.monotonic() >= deadline:
            final = dep.stop()
            break
    tick(final)
    return final


# -- status / stop --------------------------------------------------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    """Print the status the deployment last published to the scheduler (``--json``: docs/status.md)."""
    out, err = _console(), _console(stderr=True)
    found = _published(args, err, _security(args))
    if isinstance(found, int):
        return found
    _address, statuses = found
    if args.json:
        print(json.dumps(statuses[0] if len(statuses) == 1 else statuses, indent=2, default=str))
        return 0
    out = _console(width=None if args.wide else NARROW)
    for status in statuses:
        out.print(render(status, wide=args.wide))
        shown = dead_letter_lines(status, args.dead_letters)
        if args.dead_letters:
            out.print(f"newest {len(shown) // 3} dead letters of {status.get('app')}"
                      + ("" if shown else ": none kept"))
        for line in shown:
            out.print(line, overflow="fold")
    return 0


def _published(args: argparse.Namespace, err: Console, security=None) -> tuple[str, list[dict]] | int:
    """The scheduler address and every deployment's published status, or the exit code (said why)."""
    address = _scheduler_address(args.cluster, args.name, err)
    if isinstance(address, int):
        return address
    if address.startswith("tls://") and security is None and not _tls_configured():
        # said at once: without a certificate every connect attempt fails until connect-timeout
        return _fail(err, f"the scheduler at {address} speaks TLS: give --tls-ca-file, --tls-cert and --tls-key", 1)
    try:
        with _client(address, security) as client:
            statuses = _deployments(client)
    except OSError as exc:
        return _fail(err, f"cannot reach the scheduler at {address}: {exc}", 1)
    if args.cluster and args.name:
        statuses = [s for s in statuses if args.name in (s.get("name"), s.get("app"), s.get("id"))]
    if not statuses:
        return _fail(err, f"no pescheduler deployment{' ' + args.name if args.name else ''} "
                          f"has published status on {address}", 1)
    return address, statuses


def _tls_configured() -> bool:
    """Dask's own config (``distributed.comm.tls.*``) gives clients a TLS context."""
    from distributed import Security

    return Security().get_connection_args("client").get("ssl_context") is not None


def _deployments(client) -> list[dict]:
    """Every deployment's last published status on this cluster, running ones first."""
    from .control.claims import connected_clients, with_lost

    published = with_lost(client.get_metadata(["pescheduler", "deployments"], default=None) or {},
                          set(connected_clients(client)))
    return sorted(published.values(), key=lambda s: (s["state"] not in RUNNING, -s.get("elapsed_s", 0)))


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the running deployment to drain and stop, and wait until it says it has: an embedded one
    on its deploying process's socket (no cluster library imported), else through its scheduler."""
    out, err = _console(), _console(stderr=True)
    if not args.cluster:
        asked = _stop_on_socket(args, out, err)
        if asked is not None:
            return asked
    security = _security(args)
    found = _published(args, err, security)
    if isinstance(found, int):
        return found
    address, statuses = found
    running = [s for s in statuses if s["state"] in RUNNING]
    if len(running) > 1:
        names = ", ".join(f"{s['app']} ({s['id']})" for s in running)
        return _fail(err, f"{len(running)} deployments run on {address}: {names}; "
                          f"name one: `python -m pescheduler stop NAME --cluster {address}`", 2)
    client_log = logging.getLogger("distributed.client")
    level = client_log.level
    try:
        with _client(address, security) as client:
            status = (running or statuses)[0]
            if status["state"] not in RUNNING:
                # Never leave a "stop" behind: only a running deployment is asked.
                out.print(f"{status['app']} is already {status['state']}")
                return 0
            ended = _state_changes(client, status["id"])
            client.set_metadata(["pescheduler", "commands", status["id"]], "stop")
            client.log_event(command_topic(status["id"]), "stop")      # the deployment takes it now
            out.print(f"stop requested: {status['app']} drains its sources, flushes its sinks and stops…")
            status = _await_stop(client, status["id"], args.timeout, ended)
            if status is None or status["state"] not in RUNNING:
                # stopped: an embedded cluster closes with its deployment, now or while this client
                # closes, and the client's cancelled reconnect is expected then, not an error
                client_log.setLevel(logging.CRITICAL)
    except OSError:
        status = None           # the embedded cluster closed with the deployment: it stopped
    finally:
        client_log.setLevel(level)
    if status is not None and status["state"] in RUNNING:
        return _fail(err, f"{status['app']} did not stop within {args.timeout:.0f} s; "
                          f"try again or raise --timeout", 1)
    out.print(f"stopped ({status['state']})" if status else "stopped (its cluster has closed)")
    return 0


def _stop_on_socket(args: argparse.Namespace, out: Console, err: Console) -> int | None:
    """``stop`` of the named (or only) embedded deployment through its socket
    (:mod:`.control.stopsocket`): the exit code, or None when it does not answer there (a stale
    socket: its process hung or lost it) and the scheduler's path decides."""
    from .control.stopsocket import ask_to_stop

    record = _embedded(args.name, err)
    if isinstance(record, int):
        return record

    def said() -> None:
        out.print(f"stop requested: {record['app']} drains its sources, flushes its sinks and stops…")
    try:
        state = ask_to_stop(record["name"], args.timeout, said)
    except TimeoutError:
        return _fail(err, f"{record['app']} did not stop within {args.timeout:.0f} s; "
                          f"try again or raise --timeout", 1)
    if state is None:
        return None
    out.print(f"stopped ({state})")
    return 0


def _state_changes(client, deployment: str) -> threading.Event:
    """Set once ``deployment`` logs a state past running on its state topic (``WorkerGateway.publish``)."""
    ended = threading.Event()

    def seen(event) -> None:
        if event[1] not in (*RUNNING, "stopping"):
            ended.set()
    client.subscribe_topic(state_topic(deployment), seen)
    return ended


def _await_stop(client, deployment: str, timeout: float, ended: threading.Event) -> dict | None:
    """The published status once the deployment says it ended (``ended``: its state topic), read
    again every :data:`STOP_CHECK_S` as well (a state logged before the subscription took hold);
    None once the client lost the scheduler: an embedded cluster closes with its deployment, and
    a call now would wait out the client's reconnect (``cluster.connect-timeout``) to learn that."""
    deadline = time.monotonic() + timeout
    while True:
        if client.status != "running":
            return None
        status = client.get_metadata(["pescheduler", "deployments", deployment],
                                     default=None) or {"state": "stopped"}
        if status["state"] not in RUNNING or time.monotonic() >= deadline:
            return status
        ended.wait(max(0.0, min(STOP_CHECK_S, deadline - time.monotonic())))


def _scheduler_address(cluster: str | None, name: str | None, err: Console) -> str | int:
    """``--cluster``, else the named (or only) embedded deployment's scheduler; else the exit code, said why."""
    if cluster:
        return cluster
    record = _embedded(name, err)
    return record if isinstance(record, int) else record["scheduler"]


def _embedded(name: str | None, err: Console) -> dict | int:
    """The record of the named (or only) embedded deployment on this machine, once written
    (:func:`_once_started`: one still starting); else the exit code, said why."""
    if name:
        state = statefile.read(name) or _once_started(name, err)
        if state is None:
            return _fail(err, f"no deployment named {name!r} runs embedded on this machine (running: "
                              f"{_names() or 'none'}); one deployed with --cluster is found with "
                              f"`--cluster ADDR`, its scheduler's address", 1)
        return state
    running = statefile.running()
    starting = [c for c in statefile.claims() if statefile.read(c["name"]) is None]
    if not running and len(starting) == 1:
        running = [s for s in [_once_started(starting[0]["name"], err)] if s is not None]
    if not running:
        return _fail(err, "no deployment found: none runs embedded on this machine; one deployed with "
                          "--cluster is found with `--cluster ADDR`, its scheduler's address. "
                          "Start one with `python -m pescheduler deploy app.py`.", 1)
    if len(running) > 1:
        return _fail(err, f"{len(running)} deployments are running: {_names()}; name one, "
                          f"e.g. `python -m pescheduler status {running[0]['name']}`", 2)
    return running[0]


def _once_started(name: str, err: Console) -> dict | None:
    """The record of ``name`` once its deploying process has written it, when that process has
    claimed the name and is still starting its cluster (``stop NAME`` right after ``deploy``);
    None when nothing claims ``name``, or the claimant exits or is not up within
    ``cluster.connect-timeout``. The record is another process's file: this polls, bounded."""
    claimed = statefile.claim_of(name)
    if claimed is None:
        return None
    timeout = config.get_seconds("cluster.connect-timeout")
    err.print(f"{name!r} is starting (pid {claimed['pid']}); waiting up to {timeout:.0f} s for its cluster…")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = statefile.read(name)
        if state is not None or statefile.claim_of(name) is None:
            return state
        time.sleep(START_POLL_S)
    return None


def _names() -> str:
    return ", ".join(s["name"] for s in statefile.running())


def cmd_list(args: argparse.Namespace) -> int:
    """The embedded deployments running on this machine: name, app, scheduler, pid, age; with
    ``--cluster``, every deployment that published status on that cluster."""
    out = _console()
    if args.cluster:
        return _list_cluster(args, out)
    table = Table(title="deployments", title_justify="left")
    for header in ("name", "app", "scheduler", "pid", "running for"):
        table.add_column(header)
    for state in statefile.running():
        table.add_row(state["name"], state["app"], state["scheduler"], str(state["pid"]),
                      f"{time.time() - state.get('started', time.time()):.0f} s")
    out.print(table)
    return 0


def _list_cluster(args: argparse.Namespace, out: Console) -> int:
    found = _published(args, _console(stderr=True), _security(args))
    if isinstance(found, int):
        return found
    address, statuses = found
    table = Table(title=f"deployments on {address}", title_justify="left")
    for header in ("name", "app", "state", "running for"):
        table.add_column(header)
    for status in statuses:
        table.add_row(status.get("name") or status["app"], status["app"], status["state"],
                      f"{float(status.get('elapsed_s') or 0):.0f} s")
    out.print(table)
    return 0


def _client(address: str, security=None):
    from distributed import Client

    return Client(address, timeout=config.get_seconds("cluster.connect-timeout"), set_as_default=False,
                  security=security)


# -- plugins ----------------------------------------------------------------------------------

def cmd_plugins(args: argparse.Namespace) -> int:
    """List what every plug-in provides and which failed to load (exit 0 either way); ``--describe``:
    one name's parameters (exit 2 for a name nothing provides)."""
    out = _console(width=NARROW)
    found = load_plugins(tuple(args.plugin))
    if args.describe:
        return _describe(found, args.describe, out)
    out.print(operators_table(found, args.all))
    out.print(aggregates_table(found))
    defaults = config.get("policies.default") or ()
    out.print(_named_table("policies", {n: found.origins.get(n, "") + (" (default)" if n in defaults else "")
                                        for n in found.policies()}))
    out.print(_named_table("resource managers", {n: f"{c.__module__}.{c.__qualname__}"
                                                 for n, c in found.resource_managers.items()}))
    out.print(_named_table("plug-ins", dict(found.origins)))
    if found.failures:
        out.print(failures_table(found))
    return 0


def _describe(found: Plugins, name: str, out: Console) -> int:
    """Every entry called ``name``: kind, summary, a table of its parameters."""
    from .reference import describe, entries

    described = describe(found, name)
    if not described:
        hint = did_you_mean(name, {e.name for e in entries(found, everything=True)})
        return _fail(_console(stderr=True), f"nothing called {name!r} is provided by a plug-in.{hint} "
                                            f"`python -m pescheduler plugins` lists them", 2)
    for entry in described:
        out.print(Text(f"{entry.kind} {entry.name}", style="bold"), Text(entry.summary))
        table = Table(box=None, padding=(0, 1))
        for header in ("parameter", "type", "default", "meaning"):
            table.add_column(header, overflow="fold")
        for p in entry.params:
            table.add_row(p.name, p.type, p.default, p.meaning)
        out.print(table if entry.params else Text("(no parameters)"))
    return 0


KIND_ORDER = {"source": 0, "operator": 1, "sink": 2}


def operators_table(found: Plugins, everything: bool = False) -> Table:
    """Operators by kind, each with its plug-in and what it does; ``ep_*`` ones only with ``everything``."""
    table = Table(title="operators (`plugins --describe NAME`: parameters)", title_justify="left")
    for header in ("kind", "name", "plug-in", "what it does"):
        table.add_column(header, overflow="fold")
    for (kind, name), cls in sorted(found.operators.items(), key=lambda kv: (KIND_ORDER.get(kv[0][0], 9), kv[0])):
        if everything or not internal(name):
            table.add_row(kind, name, found.operator_origins.get((kind, name), ""), _first_line(cls.__doc__))
    return table


def _first_line(doc: str | None) -> str:
    """The docstring's first sentence."""
    from .reference import first_sentence

    return first_sentence(doc or "")


def aggregates_table(found: Plugins) -> Table:
    table = Table(title="aggregates", title_justify="left")
    table.add_column("name")
    table.add_column("computed from")
    table.add_column("written")
    from .collection_aggregates import PARAMETRISED

    rows = {name: (", ".join(getattr(agg, "uses", ())) or "-", f"({name!r}, field)")
            for name, agg in found.aggregates.items()}
    rows.update({name: ("-", f"({name!r}, field, {about[0]})") for name, about in PARAMETRISED.items()})
    for name, (uses, written) in sorted(rows.items()):
        table.add_row(name, uses, written)
    return table


def _named_table(title: str, rows: dict[str, str]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("name")
    table.add_column("origin")
    for name, origin in sorted(rows.items()):
        table.add_row(name, origin)
    if not rows:
        table.add_row("(none installed)", "")
    return table


def failures_table(found: Plugins) -> Table:
    """Plug-ins that failed to load, in red: name, origin, the error's last line."""
    table = Table(title="plug-ins that failed to load", title_justify="left", style="red",
                  title_style="bold red")
    for header in ("plug-in", "origin", "error"):
        table.add_column(header, style="red")
    for failure in found.failures:
        table.add_row(failure.name, failure.origin, (failure.error.strip().splitlines() or [''])[-1])
    return table


if __name__ == "__main__":      # pragma: no cover - `python -m pescheduler` goes through __main__.py
    sys.exit(main())
