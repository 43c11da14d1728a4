"""Issue 32 on a real object store: the ``files`` source reads from ``s3://`` and the parquet,
delta and iceberg sinks write to ``s3://`` (moto's S3 server, a child process on 127.0.0.1), exactly
once through a SIGKILLed sink worker, read back through the S3 API. The store has no rename: the
parquet sink's commit copies each staged object to its name."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from brokers import start_s3
from test_lakehouse import FILES, ROWS, assert_exactly_once, files_app, run_killed

pytestmark = [pytest.mark.integration, pytest.mark.broker]

KEY = {"key": "test", "secret": "test"}


@pytest.fixture(scope="module")
def s3():
    import s3fs

    with start_s3() as server:
        endpoint = f"http://{server.address}"
        fs = s3fs.S3FileSystem(**KEY, endpoint_url=endpoint)
        fs.mkdir("lake")
        for f in range(FILES):
            n = list(range(f * ROWS, (f + 1) * ROWS))
            with fs.open(f"lake/in/part-{f:03d}.parquet", "wb") as out:
                pq.write_table(pa.table({"n": n, "k": [f"k{i % 3}" for i in n]}), out, row_group_size=1_000)
        yield endpoint, fs


def sink_params(sink: str, endpoint: str, tmp_path) -> dict:
    if sink == "parquet":
        return {"path": "s3://lake/parquet", "rows": 4_000,
                "storage_options": {**KEY, "endpoint_url": endpoint}}
    if sink == "delta":
        return {"path": "s3://lake/delta", "storage_options": {
            "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}}
    return {"catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": "s3://lake/wh",
                        "s3.endpoint": endpoint, "s3.access-key-id": "test", "s3.secret-access-key": "test",
                        "s3.region": "us-east-1",
                        # through s3fs: pyarrow's S3 client's multipart completion fails on moto's server
                        "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}, "table": "lake.numbers"}


def read_back(sink: str, params: dict, fs) -> list:
    if sink == "parquet":
        return ds.dataset("lake/parquet", filesystem=fs, format="parquet", partitioning="hive").to_table().to_pylist()
    if sink == "delta":
        from deltalake import DeltaTable

        return DeltaTable(params["path"], storage_options=params["storage_options"]).to_pyarrow_table().to_pylist()
    from pyiceberg.catalog import load_catalog

    return load_catalog("default", **params["catalog"]).load_table("lake.numbers").scan().to_arrow().to_pylist()


@pytest.mark.parametrize("sink", ["parquet", "delta", "iceberg"])
def test_files_from_s3_to_a_table_on_s3_with_the_sinks_worker_killed_hold_every_row_once(s3, tmp_path, sink):
    endpoint, fs = s3
    params = sink_params(sink, endpoint, tmp_path)
    app = files_app("s3://lake/in", sink, source_options={**KEY, "endpoint_url": endpoint}, **params)
    run_killed(app, tmp_path, f"{sink}-3")
    rows = read_back(sink, params, fs)
    assert_exactly_once([{**r, "k": str(r["k"])} for r in rows])
    assert not fs.find("lake/.parquet.staging-parquet-3")            # every staged object moved or dropped
