"""PostgreSQL's ``pgoutput`` logical decoding messages (protocol version 1) as Python values.

The ``postgres_cdc`` source reads them from a replication slot through
``pg_logical_slot_peek_binary_changes``: one message a row. This module only
decodes (no connection): :class:`Decoder` keeps the relations the stream
described (a ``Relation`` message comes before a table's first change in each
decoding session) and turns Begin/Insert/Update/Delete/Commit into tuples.
Column values come as PostgreSQL text; ``loader(type oid)`` gives the function
that turns a column's text bytes into a Python value (psycopg's text loaders in
the source), looked up once per column when its relation is described.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

_SIZE = struct.Struct("!i")               # a column value's length
_COUNT = struct.Struct("!h")              # a tuple's number of columns
_OID = struct.Struct("!I")                # a relation's oid, after the message type
PG_EPOCH_MS = 946_684_800_000          # 2000-01-01 in milliseconds since 1970: pgoutput's timestamps count from it


@dataclass
class Relation:
    """A table as pgoutput describes it: columns in order, their type oids, which are the key."""

    schema: str
    name: str
    columns: list[str]
    loads: list[Callable[[bytes], Any]]     # per column: its text bytes -> the value
    key: list[str]

    def __post_init__(self) -> None:
        # The name changes carry (read once per change): ``name`` in ``public``, ``schema.name`` elsewhere.
        self.table = self.name if self.schema == "public" else f"{self.schema}.{self.name}"


class Begin(NamedTuple):
    commit_ts_ms: int


class Commit(NamedTuple):
    end_lsn: int                        # where the slot resumes after this transaction


class Change(NamedTuple):
    op: str                             # "insert" | "update" | "delete"
    relation: Relation
    before: dict | None                 # the old key (or whole row under REPLICA IDENTITY FULL)
    after: dict | None


class Truncate(NamedTuple):
    tables: list[str]


class _Reader:
    """A cursor over one message's bytes (network byte order, C strings)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from("!" + fmt, self.data, self.at)
        self.at += struct.calcsize("!" + fmt)
        return values

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text, self.at = self.data[self.at:end].decode(), end + 1
        return text

    def byte(self) -> str:
        self.at += 1
        return chr(self.data[self.at - 1])


class Decoder:
    """Decodes one slot's messages in order; ``loader(oid)`` gives a column type's load function."""

    def __init__(self, loader: Callable[[int], Callable[[bytes], Any]]) -> None:
        self.loader = loader
        self.relations: dict[int, Relation] = {}

    def decode(self, data: bytes) -> Any:
        """The message as a tuple above; ``None`` for what carries no change (Relation, Type, Origin).
        Inserts and updates without an old tuple (most messages) are read inline: no reader object,
        no dispatch."""
        kind = data[0]
        if kind == 73 or (kind == 85 and data[5] == 78):    # 'I', or 'U' whose new tuple ('N') follows
            relation = self.relations[_OID.unpack_from(data, 1)[0]]
            return Change("insert" if kind == 73 else "update", relation, None, _row(data, 6, relation)[0])
        reader = _Reader(bytes(data))
        kind = reader.byte()
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise ValueError(f"pgoutput: unknown message type {kind!r}")
        return handler(self, reader)

    def _begin(self, r: _Reader) -> Begin:
        _final_lsn, ts, _xid = r.unpack("qqI")
        return Begin(PG_EPOCH_MS + ts // 1000)

    def _commit(self, r: _Reader) -> Commit:
        _flags, _commit_lsn, end_lsn, _ts = r.unpack("bqqq")
        return Commit(end_lsn)

    def _relation(self, r: _Reader) -> None:
        (oid,) = r.unpack("I")
        schema, name = r.string(), r.string()
        _identity, count = r.unpack("bh")
        columns, loads, key = [], [], []
        for _ in range(count):
            (flags,) = r.unpack("b")
            column = r.string()
            type_oid, _typmod = r.unpack("Ii")
            columns.append(column)
            loads.append(self.loader(type_oid))
            if flags & 1:
                key.append(column)
        self.relations[oid] = Relation(schema, name, columns, loads, key)

    def _insert(self, r: _Reader) -> Change:
        relation = self.relations[r.unpack("I")[0]]
        r.byte()                                    # 'N': the new row follows
        return Change("insert", relation, None, self._tuple(r, relation))

    def _update(self, r: _Reader) -> Change:
        relation = self.relations[r.unpack("I")[0]]
        before, kind = None, r.byte()
        if kind in "KO":                            # the old key or old row, when the key changed / FULL
            before, kind = self._old(r, relation, kind), r.byte()
        return Change("update", relation, before, self._tuple(r, relation))

    def _delete(self, r: _Reader) -> Change:
        relation = self.relations[r.unpack("I")[0]]
        return Change("delete", relation, self._old(r, relation, r.byte()), None)

    def _truncate(self, r: _Reader) -> Truncate:
        count, _options = r.unpack("Ib")
        oids = r.unpack("I" * count)
        return Truncate([self.relations[o].table if o in self.relations else str(o) for o in oids])

    def _skip(self, r: _Reader) -> None:
        return None

    def _old(self, r: _Reader, relation: Relation, kind: str) -> dict:
        """The old row: its key columns only for ``K`` (the others are sent as NULLs), all for ``O``."""
        row = self._tuple(r, relation)
        return {k: row[k] for k in relation.key} if kind == "K" else row

    def _tuple(self, r: _Reader, relation: Relation) -> dict:
        row, r.at = _row(r.data, r.at, relation)
        return row


def _row(data: bytes, at: int, relation: Relation) -> tuple[dict, int]:
    """A TupleData at ``at``: the columns sent, by name (NULL as None; an unchanged TOAST value left
    out), and where it ends. The hot loop of decoding (once per column of every change)."""
    (count,) = _COUNT.unpack_from(data, at)
    at += 2
    row = {}
    for column, load in zip(relation.columns[:count], relation.loads):
        kind, at = data[at], at + 1
        if kind == 116:                                 # 't': text
            (size,) = _SIZE.unpack_from(data, at)
            row[column] = load(data[at + 4:at + 4 + size])
            at += 4 + size
        elif kind == 110:                               # 'n': NULL
            row[column] = None
        elif kind != 117:                               # 'u': unchanged TOAST, not sent
            raise ValueError(f"pgoutput: unknown column kind {chr(kind)!r} (binary mode is not asked for)")
    return row, at


_HANDLERS = {"B": Decoder._begin, "C": Decoder._commit, "R": Decoder._relation, "I": Decoder._insert,
             "U": Decoder._update, "D": Decoder._delete, "T": Decoder._truncate, "Y": Decoder._skip,
             "O": Decoder._skip, "M": Decoder._skip}
