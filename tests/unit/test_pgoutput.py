"""operators/pgoutput.py decodes pgoutput messages as PostgreSQL 15 sent them (bytes taken from a real slot).

The transaction: ``INSERT (1, 'a'), (2, 'b')``, then ``UPDATE ... SET v = 'c' WHERE id = 1``, then
``DELETE ... WHERE id = 2`` on ``t (id int PRIMARY KEY, v text)``. The integration test
(tests/integration/test_postgres_cdc.py) decodes what a live server sends.
"""

from __future__ import annotations

import pytest

from pescheduler.operators.pgoutput import PG_EPOCH_MS, Begin, Change, Commit, Decoder, Truncate

RELATION = (b"R\x00\x00@\x00public\x00t\x00d\x00\x02\x01id\x00\x00\x00\x00\x17\xff\xff\xff\xff"
            b"\x00v\x00\x00\x00\x00\x19\xff\xff\xff\xff")
BEGIN = b"B\x00\x00\x00\x00\x01R\x85\xc0\x00\x03\x04J\xe4}@\x94\x00\x00\x02\xd6"
INSERT = b"I\x00\x00@\x00N\x00\x02t\x00\x00\x00\x011t\x00\x00\x00\x01a"
UPDATE = b"U\x00\x00@\x00N\x00\x02t\x00\x00\x00\x011t\x00\x00\x00\x01c"
DELETE = b"D\x00\x00@\x00K\x00\x02t\x00\x00\x00\x012n"
COMMIT = b"C\x00\x00\x00\x00\x00\x01R\x85\xc0\x00\x00\x00\x00\x01R\x85\xf0\x00\x03\x04J\xe4}@\x94"


def decoder() -> Decoder:
    d = Decoder(lambda oid: int if oid == 23 else bytes.decode)     # 23: int4, 25: text
    assert d.decode(RELATION) is None
    return d


def test_a_transaction_decodes_to_begin_changes_and_commit():
    d = decoder()
    begin = d.decode(BEGIN)
    assert isinstance(begin, Begin) and 1.7e12 < begin.commit_ts_ms < 2.0e12 and begin.commit_ts_ms > PG_EPOCH_MS
    insert = d.decode(INSERT)
    assert isinstance(insert, Change) and (insert.op, insert.before, insert.after) == ("insert", None, {"id": 1, "v": "a"})
    assert insert.relation.table == "t" and insert.relation.key == ["id"]
    update = d.decode(UPDATE)
    assert (update.op, update.before, update.after) == ("update", None, {"id": 1, "v": "c"})   # key unchanged: no old tuple
    delete = d.decode(DELETE)
    assert (delete.op, delete.before, delete.after) == ("delete", {"id": 2}, None)   # the key only, not v's NULL
    assert d.decode(COMMIT) == Commit(0x15285F0)


def test_an_update_with_the_old_key_and_a_null_and_a_non_public_schema():
    d = Decoder(lambda oid: bytes.decode)
    d.decode(RELATION.replace(b"public", b"sales"))
    update = d.decode(b"U\x00\x00@\x00K\x00\x02t\x00\x00\x00\x012n" + b"N\x00\x02t\x00\x00\x00\x014n")
    assert (update.before, update.after, update.relation.table) == ({"id": "2"}, {"id": "4", "v": None}, "sales.t")


def test_a_truncate_names_its_tables_and_an_unknown_message_is_an_error():
    d = decoder()
    assert d.decode(b"T\x00\x00\x00\x01\x00\x00\x00@\x00") == Truncate(["t"])
    with pytest.raises(ValueError, match="unknown message type 'Z'"):
        d.decode(b"Z")
