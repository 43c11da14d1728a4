"""The reference read from the code (issue 36, item 5): `plugins --describe`, docs/reference.md, and
`plugins` fitting 80 columns without the ep planner's internal operators."""

from __future__ import annotations

from pathlib import Path

from pescheduler import cli
from pescheduler.plugins import load_plugins
from pescheduler.reference import REQUIRED, describe, markdown

REFERENCE = Path(__file__).parents[2] / "docs" / "reference.md"


def test_docs_reference_is_what_the_code_says():
    assert REFERENCE.read_text() == markdown(load_plugins()), \
        "docs/reference.md is stale: python -m pescheduler.reference > docs/reference.md"


def test_a_sink_is_described_from_its_signature_and_docstring():
    [parquet] = describe(load_plugins(), "parquet")
    params = {p.name: p for p in parquet.params}
    assert parquet.kind == "sink" and params["path"].default == REQUIRED
    assert params["rows"].default == "100000" and params["rows"].type == "int"
    assert "``partition_by``" in params["partition_by"].meaning


def test_a_name_of_two_kinds_describes_both():
    assert [e.kind for e in describe(load_plugins(), "jsonl")] == ["source", "sink"]


def test_describe_prints_each_parameter_and_a_typo_gets_a_suggestion(capsys):
    assert cli.main(["plugins", "--describe", "generator"]) == 0
    out = capsys.readouterr().out
    assert "source generator" in out and "disorder_ms" in out and "10000" in out
    assert cli.main(["plugins", "--describe", "generater"]) == 2
    assert "Did you mean 'generator'?" in capsys.readouterr().err


def test_plugins_fits_80_columns_and_hides_internal_operators_unless_all(capsys):
    assert cli.main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and not any(" ep_" in line for line in lines)
    assert cli.main(["plugins", "--all"]) == 0
    assert " ep_filter " in capsys.readouterr().out


def test_the_parametrised_aggregates_are_described_with_their_parameter(capsys):
    """percentile q, approx_percentile q, top_k k: `--describe` named nothing for them."""
    [percentile] = describe(load_plugins(), "percentile")
    assert [(p.name, p.type, p.default) for p in percentile.params] == [("field", "str", REQUIRED),
                                                                      ("q", "float", REQUIRED)]
    assert cli.main(["plugins", "--describe", "top_k"]) == 0
    out = capsys.readouterr().out
    assert "aggregate top_k" in out and "(\"top_k\", field," in out and "most frequent" in out
    assert "## aggregate `approx_percentile`" in markdown(load_plugins())
