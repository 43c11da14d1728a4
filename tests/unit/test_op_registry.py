"""The built-ins arrive through the entry-point group, as a third-party plug-in would."""

from pescheduler.plugins import load_plugins


def test_builtin_operators_load_through_the_entry_point():
    plugins = load_plugins()
    assert not [f for f in plugins.failures if f.name == "builtin-operators"]
    assert {(k, n) for k, n in plugins.operators} >= {
        ("source", "iterable"), ("source", "generator"), ("source", "jsonl"),
        ("operator", "map"), ("operator", "filter"), ("operator", "flat_map"),
        ("operator", "key_by"), ("operator", "window"), ("sink", "jsonl"), ("sink", "print")}
    assert plugins.operator_origins[("operator", "window")] == "builtin-operators"
    assert {"avg", "var", "stddev"} <= set(plugins.aggregates)
