"""Checkpoints on a real object store (moto's S3 server, a child process on 127.0.0.1).

A PE's key-group files of a checkpoint go into one segment (``state/files.py``). On an object
store the segment was held in memory and uploaded whole at its end: up to 64 MB a PE, and no byte
of it counted as written before that upload, while the coordinator aborts a write whose count of
bytes stops growing for ``pescheduler.checkpoint.timeout``. Now it goes up in parts as it is
written (s3fs's multipart upload, a part each ``PART_BYTES``), is completed at its end, and an
aborted one leaves no upload behind. Then a whole run: a window holding about 20 MB checkpointed
to S3, its worker SIGKILLed, restored, and its output exactly the reference's.

Credentials and endpoint reach the file system as any fsspec user passes them to a process and
its workers: botocore's environment (``AWS_ENDPOINT_URL`` and the keys)."""

from __future__ import annotations

import json
import os

import pytest

import pescheduler
from brokers import start_s3
from pescheduler import Application
from pescheduler.checkpoint.storage import manifest_at
from pescheduler.state.files import PART_BYTES, StateFiles, physical
from waiting import killed_and_restored, until

pytestmark = [pytest.mark.integration, pytest.mark.broker]

WAIT = 180
BUCKET = "ckpt"
KEYS = 20_000           # a 1 KB value each in the window at the hold: segments of several parts
PAD = 1_000


@pytest.fixture
def s3(monkeypatch):
    """The server, its bucket, and the environment every process of the test reads it through.
    s3fs keeps one file system per set of arguments (here none: the environment), which would
    still name another test's server: cleared before and after."""
    import boto3
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with start_s3() as server:
        env = {"AWS_ENDPOINT_URL": f"http://{server.address}", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        try:
            yield client
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


def uploads(client) -> dict[str, int]:
    """Multipart uploads in progress: key -> parts uploaded so far."""
    return {u["Key"]: len(client.list_parts(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", []))
            for u in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])}


def test_a_segment_goes_up_in_parts_as_it_is_written_and_an_aborted_one_leaves_no_upload(s3):
    files = StateFiles(f"s3://{BUCKET}/run")
    segment = files.segment(1, "pe")
    first = os.urandom(PART_BYTES * 3 // 4)
    entries = [segment.put("pe.g001.full", first)]
    assert files.written == len(first) and uploads(s3) == {}          # under a part: nothing up yet
    second = os.urandom(PART_BYTES * 3 // 4)
    entries.append(segment.put("pe.g002.full", second))
    assert files.written == len(first) + len(second)
    assert uploads(s3) == {"run/chk-000001/pe.seg0": 1}                # a part up while it is written
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)          # the object: only once complete
    segment.close()
    assert uploads(s3) == {}
    assert [files.read(e) for e in entries] == [first, second]         # each range, its SHA-256 checked
    assert {physical(e) for e in entries} == {"chk-000001/pe.seg0"}

    aborted = files.segment(2, "pe")
    aborted.put("pe.g001.full", os.urandom(PART_BYTES * 3 // 2))
    assert uploads(s3) == {"run/chk-000002/pe.seg0": 1}
    aborted.abort()
    assert uploads(s3) == {}                                            # no part left stored
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == ["run/chk-000001/pe.seg0"]


def padded(n: int) -> str:
    return str(n).rjust(PAD, "x")


def test_a_window_checkpointed_to_s3_is_restored_exactly_after_its_worker_is_killed(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("PESCHEDULER__STATE__DIR", str(tmp_path / "stores"))
    out, release = tmp_path / "out.jsonl", tmp_path / "release"
    storage = f"s3://{BUCKET}/window"
    app = Application("on-s3")
    (app.source("numbers", count=2 * KEYS, keys=KEYS, hold_at=KEYS, release=str(release))
        .map(lambda e: {**e, "p": str(e["n"]).rjust(1_000, "x")})
        .key_by("key").window(count=2, aggregates={"m": ("max", "p")})
        .sink("jsonl", path=str(out)))
    with pescheduler.deploy(app, workers=2, plugins=["support_ops"], policies=[], checkpoint=storage,
                            checkpoint_interval="1h") as dep:
        op = next(x for x in dep.placement().plan.ops if x.startswith("count_window"))
        until(lambda: op in (ops := dep.snapshot().operators) and ops[op].tuples_in >= KEYS, WAIT,
              "the window to hold every key's first value")
        done = dep.checkpoint(timeout=WAIT)
        url = next(c["url"] for c in dep.checkpoints() if c["id"] == done)
        groups = [e for e in manifest_at(url)["files"] if e["role"] == "group"]
        segments: dict[str, int] = {}
        for e in groups:
            segments[physical(e)] = max(segments.get(physical(e), 0), e["at"] + e["bytes"])
        assert max(segments.values()) > PART_BYTES, f"no segment of more than a part: {segments}"
        run = StateFiles(url.rsplit("/", 1)[0])
        assert sum(len(run.read(e)) for e in groups) == sum(e["bytes"] for e in groups)   # each SHA-256 checked
        placement = dep.placement()
        killed_and_restored(dep, dep.worker_info[placement.pes[placement.pe_of(op)].worker]["pid"], WAIT)
        release.touch()
        status = dep.wait(timeout=WAIT)
    assert status["state"] == "finished"
    with open(out) as f:
        rows = sorted((r["key"], r["window_start"], r["window_end"], r["m"]) for r in map(json.loads, f))
    assert rows == sorted((k, k, k + KEYS + 1, max(padded(k), padded(k + KEYS))) for k in range(KEYS))
    assert uploads(s3) == {}
