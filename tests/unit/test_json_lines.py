"""An Arrow batch to the jsonl sink: the very bytes its rows give, written without making rows."""

import datetime
import os

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from pescheduler.operator import Emitter
from pescheduler.operators.json_lines import arrow_lines
from pescheduler.operators.sinks import JsonlSink, _encode, _lines

FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e10, 1e10),
                   st.sampled_from([0.0, -0.0, 1e-4, 9.999e-5, 1e10, 9999999999.999998, 100.0, -3.0, 0.1]),
                   st.integers(-10**6, 10**6).map(lambda i: i / 8))
TEXT = st.one_of(st.text(), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126)))
IN_RANGE = st.one_of(st.floats(1e-4, 1e10, exclude_max=True), st.floats(-1e10, -1e-4, exclude_min=True),
                     st.sampled_from([0.0, -0.0, 1e-4, 100.0]), st.integers(-10**6, 10**6).map(lambda i: i / 8))
PLAIN = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'))
COLUMNS = {                                   # Arrow type -> values (None: a null)
    "int64": (pa.int64(), st.integers(-2**63, 2**63 - 1)), "uint8": (pa.uint8(), st.integers(0, 255)),
    "float64": (pa.float64(), FLOATS), "float64 formatted by Arrow": (pa.float64(), IN_RANGE),
    "plain string": (pa.string(), PLAIN), "plain dictionary": (pa.dictionary(pa.int8(), pa.string()), PLAIN),
    "float32": (pa.float32(), st.floats(width=32)),
    "bool": (pa.bool_(), st.booleans()), "string": (pa.string(), TEXT), "large_string": (pa.large_string(), TEXT),
    "dictionary": (pa.dictionary(pa.int32(), pa.string()), TEXT),
    "timestamp": (pa.timestamp("ms"), st.datetimes(datetime.datetime(1970, 1, 1), datetime.datetime(2100, 1, 1))),
    "list": (pa.list_(pa.float64()), st.lists(FLOATS, max_size=3)),
}


@st.composite
def batches(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=5))
    names = draw(st.lists(TEXT, min_size=len(kinds), max_size=len(kinds)))
    rows = draw(st.integers(1, 30))
    arrays = []
    for kind in kinds:
        t, values = COLUMNS[kind]
        column = draw(st.lists(st.one_of(st.none(), values), min_size=rows, max_size=rows))
        arrays.append(pa.array(column, t))
    return pa.RecordBatch.from_arrays(arrays, names=names)


@settings(max_examples=200, deadline=None)
@given(batches())
def test_an_arrow_batch_gives_the_bytes_its_rows_give(batch):
    assert arrow_lines(batch, _encode) == _lines(batch.to_pylist()).encode()


def test_the_jsonl_sink_takes_an_arrow_batch_whole_and_writes_its_rows_lines(tmp_path):
    batch = pa.RecordBatch.from_pydict({"car": pa.array(["c1", "c2", "c1"]).dictionary_encode(),
                                        "window_start": [0, 60_000, 60_000], "avg_speed": [12.5, 3.0, 1e-5]})
    sink = JsonlSink(str(tmp_path / "out.jsonl"))
    assert sink.columnar                        # the chain hands it the batch, not rows
    sink.open(type("Context", (), {"extra": {}, "op_id": "jsonl-1"})())
    sink.process(batch, Emitter())
    sink.close()
    with open(tmp_path / "out.jsonl", "rb") as f:
        assert f.read() == _lines(batch.to_pylist()).encode()
    assert os.path.getsize(tmp_path / "out.jsonl") > 0
