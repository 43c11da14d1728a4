"""Playing the intruder against real deployments: nobody but the deployment's processes reaches a PE.

The intruder is this test process, an outsider on the same host, knowing
everything an outsider can learn: every channel id (the scheduler's
metadata) and every data server's address (the ``pe_info`` RPC). It does
not know the deployment's secret. Each attack is made on every channel that
crosses workers while the stream runs; then the stream is drained and its
output must be exact: every number once, in order, running sums right,
nothing forged, nothing executed, no dead letter, no stall.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import ssl

import psutil
import pytest

import pescheduler
from pescheduler import Application
from pescheduler.worker import handshake
from guarded import assert_drained, assert_exact, running_app, sink_on_a_borrowed_tls_host
from waiting import until
from pescheduler.worker.channels import CHALLENGE, DATA, HEADER, HELLO, MARKER, WATERMARK, WELCOME, WM

pytestmark = pytest.mark.integration

BOUND = 60.0        # seconds: every wait here is bounded by this


def crossing_channels(dep) -> list[tuple[str, str]]:
    """``(channel id, receiving data server)`` of every channel between two workers."""
    pl = dep.placement()
    found = []
    for (src, _port, dst_pe), channel_id in dep.reconfigurer.channels.items():
        sender, receiver = pl.pes[pl.pe_of(src)].worker, pl.pes[dst_pe].worker
        if sender != receiver:
            found.append((channel_id, dep.worker_info[receiver]["data_address"]))
    assert found, "the placement has no channel between workers: nothing to attack"
    return found


def frame(kind: int, body: bytes = b"") -> bytes:
    return HEADER.pack(len(body), kind) + body


def frames_in(data: bytes) -> list[int]:
    kinds = []
    while len(data) >= HEADER.size:
        length, kind = HEADER.unpack_from(data)
        kinds.append(kind)
        data = data[HEADER.size + length:]
    return kinds


def intrude(address: str, payload: bytes, tls: ssl.SSLContext | None = None) -> bytes:
    """Connect, send ``payload``, and return all the server sent until it closed the connection."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=BOUND)
    got = b""
    try:
        if tls is not None:
            sock = tls.wrap_socket(sock)
        sock.sendall(payload)
        while chunk := sock.recv(65536):
            got += chunk
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
        pass                       # closed on us: what we want (TimeoutError is not caught: a failure)
    finally:
        sock.close()
    return got


def hang_up(address: str, payload: bytes) -> None:
    """Connect, send ``payload`` and close at once, without waiting for any answer."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=BOUND) as sock:
        sock.sendall(payload)


class Pwn:
    """Unpickling this creates a file: proof of code execution if it ever exists."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def attacks(channel_id: str, evil: str) -> dict[str, bytes]:
    forged_rows = pickle.dumps([{"n": -1, "key": 0, "ts": 0, "tag": "x"}], protocol=5)
    fake_nonce = handshake.new_nonce()
    forged_hello = handshake.encode_hello(channel_id, fake_nonce, os.urandom(32))
    return {
        "forged HELLO": frame(HELLO, forged_hello),
        "forged marker carrying a pickle": frame(HELLO, forged_hello) + frame(MARKER, pickle.dumps(Pwn(evil))),
        "pickle marker without HELLO": frame(MARKER, pickle.dumps(Pwn(evil))),
        "forged data and watermark": (frame(HELLO, forged_hello) + frame(DATA, forged_rows)
                                      + frame(WATERMARK, WM.pack(2**62))),
        "the old protocol's bare HELLO, then data": frame(HELLO, channel_id.encode()) + frame(DATA, forged_rows),
        "garbage": os.urandom(4096),
        "a header announcing 4 GB": HEADER.pack(0xFFFFFF00, DATA) + b"\0" * 1024,
    }


def test_intruders_are_refused_and_the_stream_stays_exact(cluster, tmp_path):
    out, evil = tmp_path / "sums.jsonl", str(tmp_path / "pwned")
    with pescheduler.deploy(running_app(out), cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        for channel_id, address in crossing_channels(dep):
            for name, payload in attacks(channel_id, evil).items():
                answer = intrude(address, payload)
                kinds = frames_in(answer)
                assert kinds[:1] == [CHALLENGE] and WELCOME not in kinds, f"{name}: answered {kinds}"
            hang_up(address, frame(HELLO, channel_id.encode()))           # a bare HELLO, then gone
            hang_up(address, frame(HELLO, handshake.encode_hello(channel_id, handshake.new_nonce(), b"x" * 32)))
        assert dep.status()["state"] == "running"
        assert_drained(dep.stop())
        assert dep.dead_letters() == []
    assert assert_exact(out) > 0
    assert not os.path.exists(evil), "an intruder's pickle ran inside a worker"


def test_two_deployments_cannot_feed_each_other(cluster, tmp_path):
    """Secrets are per deployment: a PE of one cannot open a channel into the other."""
    from pescheduler.worker.channels import TcpChannelOut
    from pescheduler.worker.handshake import Credentials, HandshakeRefused
    import asyncio

    with pescheduler.deploy(running_app(tmp_path / "a.jsonl"), cluster=cluster, plugins=["support_ops"],
                            policies=[]) as a:
        channel_id, address = crossing_channels(a)[0]
        other_secret = handshake.new_secret()        # another deployment's, as a PE of it would hold

        async def connect():
            out = TcpChannelOut(channel_id, 8, lambda item, exc: None)
            await out.connect(address, Credentials(other_secret))
        with pytest.raises(HandshakeRefused):
            asyncio.run(connect())
        assert_drained(a.stop())
    assert_exact(tmp_path / "a.jsonl")


@pytest.fixture(scope="module")
def tls_cluster():
    """A LocalCluster whose every Dask comm is TLS with require_encryption (like ``dask scheduler
    --protocol tls``), with throw-away certificates made here; closed by this fixture."""
    from distributed import LocalCluster, Security

    security = Security.temporary()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", security=security) as local:
        assert local.scheduler_address.startswith("tls://")
        yield local.scheduler_address, security


def test_a_tls_cluster_refuses_plain_connections_to_its_data_servers(tls_cluster, tmp_path):
    address, security = tls_cluster
    out = tmp_path / "sums.jsonl"
    with pescheduler.deploy(running_app(out), cluster=address, security=security, plugins=["support_ops"],
                            policies=[]) as dep:
        channels = crossing_channels(dep)
        client_tls = security.get_connection_args("client")["ssl_context"]
        stranger = ssl.create_default_context()          # TLS, but no certificate of this cluster
        stranger.check_hostname, stranger.verify_mode = False, ssl.CERT_NONE
        for channel_id, data_address in channels:
            hello = frame(HELLO, channel_id.encode())
            plain = intrude(data_address, hello)
            assert CHALLENGE not in frames_in(plain)[:1], "a plain connection was answered in the clear"
            assert intrude(data_address, hello, tls=stranger) == b""    # mutual TLS: no certificate, no talk
            # A holder of the cluster's certificate is still no member of the deployment:
            answer = intrude(data_address, frame(HELLO, handshake.encode_hello(
                channel_id, handshake.new_nonce(), os.urandom(32))), tls=client_tls)
            assert frames_in(answer) == [CHALLENGE]
        assert_drained(dep.stop())
        assert dep.dead_letters() == []
    assert assert_exact(out) > 0


def listening(pid: int) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_the_embedded_cluster_listens_on_loopback_only_and_data_servers_on_the_worker_address(tmp_path):
    me = psutil.Process()
    before = listening(me.pid)
    children_before = {p.pid for p in me.children(recursive=True)}
    with pescheduler.deploy(running_app(tmp_path / "o.jsonl", count=2000), workers=2, rm="none",
                            plugins=["support_ops"], policies=[]) as dep:
        opened = listening(me.pid) - before                      # scheduler, dashboard
        for child in me.children(recursive=True):               # nannies and workers
            if child.pid not in children_before:
                opened |= listening(child.pid)
        data = {info["data_address"] for info in dep.worker_info.values()}
        dep.wait(timeout=BOUND)
    assert len(opened) >= 6, opened          # scheduler, dashboard, 2 nannies, 2 workers, 2 data servers
    assert {ip for ip, _port in opened} == {"127.0.0.1"}, opened
    assert {f"{ip}:{port}" for ip, port in opened} >= data


def test_data_servers_bind_the_workers_own_address(cluster, tmp_path):
    with pescheduler.deploy(running_app(tmp_path / "o.jsonl", count=2000), cluster=cluster,
                            plugins=["support_ops"], policies=[]) as dep:
        for worker, info in dep.worker_info.items():
            host, port = info["data_address"].rsplit(":", 1)
            assert worker.startswith(f"tcp://{host}:")
            assert (host, int(port)) in listening(info["pid"])
            assert ("0.0.0.0", int(port)) not in listening(info["pid"])
        dep.wait(timeout=BOUND)


def test_deploy_with_security_true_runs_the_embedded_cluster_on_tls(tmp_path):
    out = tmp_path / "o.jsonl"
    with pescheduler.deploy(running_app(out, count=3000), workers=2, security=True, rm="none",
                            plugins=["support_ops"], policies=[]) as dep:
        assert dep.scheduler_address.startswith("tls://")
        channel_id, data_address = crossing_channels(dep)[0]
        assert CHALLENGE not in frames_in(intrude(data_address, frame(HELLO, channel_id.encode())))[:1]
        dep.wait(timeout=BOUND)
    assert assert_exact(out) == 3000


def test_security_true_is_refused_for_a_given_cluster(cluster):
    with pytest.raises(ValueError, match="throw-away certificates"):
        pescheduler.deploy(running_app("unused"), cluster=cluster, security=True)


CLI_APP = """
from pescheduler import Application

app = Application("tls-cli")
(app.source("generator", events=None, keys=50, rate=20_000)
    .key_by("car").window(size="1s", aggregates={{"n": ("count", "speed")}})
    .sink("jsonl", path={out!r}))
"""


def certificate_files(tmp_path) -> list[str]:
    """``--tls-ca-file/--tls-cert/--tls-key`` of a throw-away self-signed certificate made here."""
    from distributed import Security

    made = Security.temporary()
    (tmp_path / "ca.pem").write_text(made.tls_ca_file)
    (tmp_path / "cert.pem").write_text(made.tls_client_cert)
    (tmp_path / "key.pem").write_text(made.tls_client_key)
    return ["--tls-ca-file", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "cert.pem"),
            "--tls-key", str(tmp_path / "key.pem")]


def test_the_cli_tls_flags_run_deploy_status_and_stop_over_tls(tmp_path):
    import subprocess
    import sys

    from waiting import reap, until

    out, states = tmp_path / "counts.jsonl", tmp_path / "state"
    (tmp_path / "app.py").write_text(CLI_APP.format(out=str(out)))
    tls = certificate_files(tmp_path)
    env = {**os.environ, "PESCHEDULER__STATE_DIR": str(states)}
    state = states / "tls-cli.json"                  # one state file per deployment, named after it

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pescheduler", *args], capture_output=True, text=True,
                              env=env, timeout=BOUND * 2)

    log = open(tmp_path / "deploy.log", "w")          # a file, not a pipe nobody reads: it would fill and block
    deploy = subprocess.Popen([sys.executable, "-m", "pescheduler", "deploy", str(tmp_path / "app.py"),
                               "--workers", "2", "--rm", "none", "--policy", "none", "--name", "tls-cli", *tls],
                              stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        until(lambda: state.exists() or deploy.poll() is not None, BOUND * 2, "the deployment's state file")
        assert deploy.poll() is None, (tmp_path / "deploy.log").read_text()
        assert json.loads(state.read_text())["scheduler"].startswith("tls://")
        assert cli("status", "--json").returncode != 0               # no certificate: no talk
        shown = cli("status", "--json", *tls)
        assert shown.returncode == 0, shown.stderr
        stop = cli("stop", *tls)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert deploy.wait(timeout=BOUND * 2) == 0
    finally:
        reap(deploy)                                 # by the PID this test started
        log.close()
    assert sum(json.loads(line)["n"] for line in out.read_text().splitlines()) > 0


def test_tls_flags_must_come_together(tmp_path, capsys):
    from pescheduler.cli import main

    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--cluster", "tls://127.0.0.1:1", "--tls-ca-file", str(tmp_path / "ca.pem")])
    assert exit_.value.code == 2
    assert "--tls-cert, --tls-key" in capsys.readouterr().err


def test_a_host_borrowed_from_the_local_manager_joins_a_tls_cluster_over_tls(tmp_path):
    """The local resource manager's own Client and the workers it starts take the deployment's
    certificates: borrowing works on a TLS cluster, and the borrowed worker's data server refuses
    a plain connection as the others do."""
    import dask

    from waiting import until

    out = tmp_path / "o.jsonl"
    with dask.config.set({"pescheduler.rm.local.oversubscribe": True, "pescheduler.rm.local.hosts": 1}):
        with pescheduler.deploy(running_app(out), workers=2, security=True, rm="local",
                                plugins=["support_ops"], policies=[]) as dep:
            assert dep.scheduler_address.startswith("tls://")
            until(lambda: dep.resources().lendable == 1, BOUND, "the local manager to reach the TLS scheduler")
            worker = sink_on_a_borrowed_tls_host(dep, BOUND)
            data_address = dep.worker_info[worker]["data_address"]
            channel_id = next(c for c, address in crossing_channels(dep) if address == data_address)
            assert CHALLENGE not in frames_in(intrude(data_address, frame(HELLO, channel_id.encode())))[:1]
            assert_drained(dep.stop())
    assert assert_exact(out) > 0


def test_the_embedded_dashboard_listens_elsewhere_only_when_asked():
    """The default is loopback (test above); ``pescheduler.cluster.dashboard`` moves it, and the
    link printed for a browser on this machine still works."""
    import asyncio
    import urllib.request

    import dask

    from pescheduler.control.cluster import EmbeddedCluster

    async def started() -> tuple[int, str, str]:
        with dask.config.set({"pescheduler.cluster.dashboard": "0.0.0.0:0"}):
            cluster = EmbeddedCluster(0)
            await cluster.start()
        try:
            port = cluster._scheduler.http_server.port
            assert ("0.0.0.0", port) in listening(os.getpid())
            link = cluster.dashboard_link.replace("/status", "/pescheduler")
            page = await asyncio.to_thread(lambda: urllib.request.urlopen(link, timeout=BOUND).read().decode())
            return port, link, page
        finally:
            await cluster.close()
    port, link, page = asyncio.run(started())
    assert link == f"http://127.0.0.1:{port}/pescheduler" and "No deployment has published status" in page


def test_a_flood_of_unauthenticated_connections_is_capped_and_the_stream_stays_exact(cluster, tmp_path):
    """Hundreds of silent connections to a real worker's data server: at most
    ``channel.handshake.max-pending`` are taken into the handshake (each with a few KiB, not a
    256 KiB buffer), the rest are closed on arrival; once they go, new ones are taken again."""
    from pescheduler import config

    cap, out = int(config.get("channel.handshake.max-pending")), tmp_path / "sums.jsonl"
    with pescheduler.deploy(running_app(out), cluster=cluster, plugins=["support_ops"], policies=[]) as dep:
        _channel_id, address = crossing_channels(dep)[0]
        host, port = address.rsplit(":", 1)
        flood = [socket.create_connection((host, int(port)), timeout=BOUND) for _ in range(4 * cap)]
        try:
            challenged = sum(1 for sock in flood if _first_bytes(sock))
        finally:
            for sock in flood:
                sock.close()
        assert 0 < challenged <= cap, f"{challenged} of {len(flood)} flood connections got a CHALLENGE"
        hello = frame(HELLO, handshake.encode_hello("x", handshake.new_nonce(), b""))
        until(lambda: frames_in(intrude(address, hello))[:1] == [CHALLENGE], BOUND,     # the server sees the
              "the gate taking new connections once the flood went")                   # flood's EOFs first
        assert dep.status()["state"] == "running"
        assert_drained(dep.stop())
        assert dep.dead_letters() == []
    assert assert_exact(out) > 0


def _first_bytes(sock: socket.socket) -> bytes:
    """What the server sent first: its CHALLENGE, or nothing when it closed the connection at once."""
    try:
        return sock.recv(64)
    except (ConnectionResetError, BrokenPipeError):
        return b""
