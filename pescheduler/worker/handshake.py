"""Who may talk to a PE: the data plane's handshake, its closed control format, and its TLS.

Trust model (docs/security.md): whoever may deploy may run code, as in Dask;
nobody else may put a byte into a PE. Each deployment draws a random secret
(:func:`new_secret`) and hands it to the PE hosts over Dask's own RPC, which
is already trusted (TLS whenever the cluster uses TLS). A data connection is
then accepted only from a process that holds the secret:

1. the data server speaks first, a CHALLENGE of fresh random bytes;
2. the sender answers HELLO: the channel id, its own nonce, and an HMAC of
   both nonces and the channel id under the secret (the secret never travels);
3. the server checks it (constant time) and only then touches any receiver;
   it answers WELCOME, its own HMAC, so the sender knows it reached a process
   of the same deployment and not whatever took over the port.

Why HMAC-SHA256 over a nonce rather than TLS client certificates alone: the
secret is per deployment, so two deployments on one cluster cannot feed each
other, and it costs one round trip at connect and nothing per frame. TLS is
added on top whenever the Dask cluster has certificates (:func:`tls_contexts`),
with the same certificates Dask uses (``distributed.Security``).

Control frames (HELLO, markers) are msgpack, a closed format: nothing from
the network is ever unpickled before the peer proved itself, and markers never.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import ssl
from dataclasses import dataclass
from time import monotonic
from typing import Any, Callable

import msgpack

from .. import config

logger = logging.getLogger(__name__)

NONCE_BYTES = 32
SECRET_BYTES = 32
HANDSHAKE_TIMEOUT_S = 20.0      # an unauthenticated connection is closed after this long
MAX_HELLO_BYTES = 4096          # before the proof, no frame may be larger (nothing is buffered for it)
_CLIENT = b"pescheduler data hello v1\0"
_SERVER = b"pescheduler data welcome v1\0"


class HandshakeGate:
    """What unauthenticated connections may cost a worker: at most ``max_pending`` of them at once
    and ``per_second`` new ones (a token bucket, bursts up to ``per_second``); the rest are closed
    on arrival, before any buffer is allocated for them. Refusals (these and failed handshakes)
    are logged once per ``log_every_s``, with their count, not once each: a flood must not
    become a flood of log lines.
    """

    def __init__(self, max_pending: int, per_second: float, log_every_s: float,
                 clock: Callable[[], float] = monotonic) -> None:
        self.max_pending, self.per_second, self.log_every_s, self.clock = max_pending, per_second, log_every_s, clock
        self.pending = 0
        self.tokens, self.refilled = float(per_second), clock()
        self.refused = 0                     # since the last log line
        self.logged_at = -float("inf")

    def admit(self, peer: Any) -> bool:
        """Take a new connection from ``peer`` into the handshake (call :meth:`done` once when it
        ends, proven or not), or refuse it: False, and it is counted for the log."""
        now = self.clock()
        self.tokens = min(float(self.per_second), self.tokens + (now - self.refilled) * self.per_second)
        self.refilled = now
        if self.pending >= self.max_pending or self.tokens < 1:
            self.refuse(peer, f"over {self.max_pending} unauthenticated connections at once or "
                              f"{self.per_second:g} new ones a second")
            return False
        self.tokens -= 1
        self.pending += 1
        return True

    def done(self) -> None:
        self.pending -= 1

    def refuse(self, peer: Any, reason: str) -> None:
        """Count a refused connection; log it, with those since the last line, once per interval."""
        self.refused += 1
        now = self.clock()
        if now - self.logged_at >= self.log_every_s:
            logger.warning("refused %d data connection(s) in the last %g s; the last from %s: %s",
                           self.refused, self.log_every_s, peer, reason)
            self.refused, self.logged_at = 0, now


_gate: HandshakeGate | None = None


def gate() -> HandshakeGate:
    """This worker's gate (one data server per worker process), from ``channel.handshake.*``."""
    global _gate
    if _gate is None:
        _gate = HandshakeGate(int(config.get("channel.handshake.max-pending")),
                              float(config.get("channel.handshake.per-second")),
                              config.get_seconds("channel.handshake.log-every"))
    return _gate


class HandshakeRefused(ConnectionError):
    """The peer could not prove it belongs to the same deployment (or spoke out of turn)."""


@dataclass(frozen=True)
class Credentials:
    """What a sender needs to open a channel: its deployment's secret and the TLS context (or None)."""

    secret: bytes
    ssl: ssl.SSLContext | None = None

    def __repr__(self) -> str:          # never print the secret
        return f"Credentials(tls={self.ssl is not None})"


def new_secret() -> bytes:
    """A fresh per-deployment secret (256 random bits from the OS)."""
    return secrets.token_bytes(SECRET_BYTES)


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def _mac(secret: bytes, label: bytes, server_nonce: bytes, client_nonce: bytes, channel_id: str) -> bytes:
    msg = label + server_nonce + client_nonce + channel_id.encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, channel_id: str) -> bytes:
    """The sender's proof in HELLO."""
    return _mac(secret, _CLIENT, server_nonce, client_nonce, channel_id)


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes, channel_id: str) -> bytes:
    """The data server's proof in WELCOME (a different label: a HELLO cannot be reflected back)."""
    return _mac(secret, _SERVER, server_nonce, client_nonce, channel_id)


def verify(expected: bytes, given: Any) -> bool:
    return isinstance(given, bytes) and hmac.compare_digest(expected, given)


def encode_hello(channel_id: str, client_nonce: bytes, proof: bytes) -> bytes:
    return msgpack.packb([channel_id, client_nonce, proof], use_bin_type=True)


def decode_hello(body: bytes) -> tuple[str, bytes, bytes]:
    """``(channel_id, client_nonce, proof)``; ValueError for anything else."""
    try:
        channel_id, nonce, proof = msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=True)
    except Exception as exc:
        raise ValueError(f"malformed HELLO ({type(exc).__name__})") from None
    if not (isinstance(channel_id, str) and isinstance(nonce, bytes) and len(nonce) == NONCE_BYTES
            and isinstance(proof, bytes)):
        raise ValueError("malformed HELLO (wrong field types)")
    return channel_id, nonce, proof


def encode_control(value: Any) -> bytes:
    """A marker (or other control value) in msgpack: str, int, float, bytes, tuples, dicts of those."""
    return msgpack.packb(value, use_bin_type=True)


def decode_control(body: bytes) -> Any:
    """The inverse of :func:`encode_control`; lists come back as tuples so markers stay hashable."""
    return msgpack.unpackb(body, raw=False, use_list=False)


def tls_contexts(security) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """``(server, client)`` TLS contexts for the data plane from a worker's ``distributed.Security``.

    Both use the worker role's certificate and the cluster CA, and require the
    peer's certificate (mutual TLS), exactly as Dask's own worker comms do. No
    certificates: ``(None, None)``, unless ``require_encryption`` is set, which
    refuses to run the data plane in the clear.
    """
    if security is None:
        return None, None
    server = security.get_listen_args("worker")["ssl_context"]
    client = security.get_connection_args("worker")["ssl_context"]
    if security.require_encryption and (server is None or client is None):
        raise RuntimeError("distributed.comm.require-encryption is set but this worker has no TLS "
                           "certificate: the PE data plane refuses to run in the clear")
    return server, client
