"""The parquet sink's files, written by a running stream, read back by Spark: the same rows."""

from __future__ import annotations

import dask
import pytest

import pescheduler
from pescheduler import Application

pytestmark = pytest.mark.spark

EVENTS = 20_000


@pytest.fixture(scope="module")
def spark():
    """One local Spark application reads every test's table (each test had its own: a driver JVM
    started and stopped per test); each test reads only its own folder. Stopped with its driver
    JVM at the module's end, so none outlives the tests."""
    from pyspark.sql import SparkSession

    from pescheduler.resource_managers.spark import stop_driver_jvm

    session = (SparkSession.builder.master("local[1]").appName("read-parquet")
               .config("spark.driver.memory", "512m").config("spark.ui.enabled", "false").getOrCreate())
    try:
        yield session
    finally:
        session.stop()
        stop_driver_jvm()


def test_spark_reads_the_streams_parquet_files_as_the_streams_output(spark, tmp_path):
    import connected_cars

    app = Application("cars-to-parquet")
    (app.source("generator", **{**connected_cars.GENERATOR, "events": EVENTS})
        .map(connected_cars.to_metres_per_second)
        .filter(connected_cars.moving)
        .key_by("car")
        .window(size="60s", aggregates={"avg_speed": ("avg", "speed")})
        .sink("parquet", path=str(tmp_path / "avg"), roll="60s", ts_field="window_start", rows=5_000))
    with dask.config.set({"pescheduler.policies.default": []}), pescheduler.deploy(app, workers=2) as dep:
        assert dep.wait(timeout=120)["state"] == "finished"

    table = spark.read.parquet(str(tmp_path / "avg"))
    rows = [r.asDict() for r in table.collect()]
    files = table.inputFiles()
    key = lambda r: (r["window_start"], r["car"])         # noqa: E731
    expected = sorted(connected_cars.reference(EVENTS), key=key)
    assert sorted(rows, key=key) == expected
    assert len(files) == -(-len(expected) // 5_000)           # rolled at 5,000 rows per file


def test_spark_reads_a_checkpointed_parquet_table_written_from_files_exactly(spark, tmp_path):
    """Files in (the ``files`` source), the two-phase parquet sink out: staged files live beside
    the table, so Spark reads exactly the committed rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    for f in range(4):
        pq.write_table(pa.table({"n": list(range(f * 1000, (f + 1) * 1000))}), tmp_path / "in" / f"{f}.parquet")
    app = Application("files-to-parquet")
    (app.source("files", path=str(tmp_path / "in"), ts_field=None)
        .sink("parquet", path=str(tmp_path / "table"), rows=1_500))
    with pescheduler.deploy(app, workers=2, policies=[], checkpoint=str(tmp_path / "ckpt"),
                            checkpoint_interval="0.2s") as dep:
        assert dep.wait(timeout=120)["state"] == "finished"
    numbers = sorted(r["n"] for r in spark.read.parquet(str(tmp_path / "table")).collect())
    assert numbers == list(range(4000))
