"""A SELECT's JOIN: which join operator it is, on which key and times, and its rows made flat.

Three forms, each one operator of the app (so a joined query is copied, moved and
checkpointed like the rest):

* ``FROM a JOIN b ON a.k = b.k AND a.ts BETWEEN b.ts - INTERVAL '5' SECOND AND b.ts``:
  the interval join (``join_interval``); the bounds are INTERVALs or milliseconds;
* ``FROM a ASOF [LEFT] JOIN b ON a.k = b.k AND a.ts >= b.ts`` (DuckDB's form; ``<=``
  looks forward): the as-of join (``join_asof``);
* ``FROM a [LEFT] JOIN b FOR SYSTEM_TIME AS OF a.ts ON a.k = b.k`` (Flink's temporal
  join): ``b`` is a changelog (CDC changes or a ``latest()``) and each row of ``a``
  meets ``b``'s row as of its time (``lookup(as_of=True)``).

A joined row has the fields of both sides qualified by their table's name or alias
(``a.k``, ``b.price``) and ``ts`` (the left row's, or the later of the two for an
interval join), so a query's other clauses read them as ``a.k``. Both sides name the
key and the time alike (copies route both inputs by one field). An inner as-of or
temporal join drops a left row with no match; LEFT JOIN keeps it with NULLs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from sqlglot import exp

from ..plan.app import Stream
from .parse import error


@dataclass
class JoinPlan:
    """One JOIN: ``kind`` (interval, asof, temporal), the sources, their qualifiers, key and time."""

    kind: str
    sources: tuple[str, str]
    names: tuple[str, str]              # how the query qualifies each side's fields
    key: str
    ts_field: str
    bounds: tuple[int, int] = (0, 0)    # interval: lower, upper of right ts - left ts (ms)
    direction: str = "backward"         # asof
    outer: bool = False                 # LEFT JOIN: keep a left row without a match
    right_fields: list[str] = field(default_factory=list)   # read by the query (NULL when unmatched)


def plan_join(select: exp.Select, query: str, interval) -> JoinPlan:
    """The JOIN of ``select`` (one, of two named sources); ``interval``: INTERVAL -> ms."""
    joins = select.args["joins"]
    if len(joins) > 1:
        raise error(query, joins[1], "one JOIN per SELECT: join the result in another query")
    join, left = joins[0], select.args["from_"].this
    right = join.this
    for table in (left, right):
        if not (isinstance(table, exp.Table) and isinstance(table.this, exp.Identifier)):
            raise error(query, table, f"JOIN reads two sources by name, got {table.sql()}")
    side = join.args.get("side") or ""
    if side.upper() not in ("", "LEFT") or join.args.get("kind"):
        raise error(query, join, f"{(side + ' ' + (join.args.get('kind') or '')).strip().upper()} JOIN "
                                 f"is not supported: JOIN or LEFT JOIN")
    names = (left.alias_or_name, right.alias_or_name)
    plan = JoinPlan("", (left.name, right.name), names, "", "", outer=side.upper() == "LEFT")
    on = join.args.get("on")
    if on is None:
        raise error(query, join, "a streaming JOIN needs ON with the key's equality")
    conditions = _conjuncts(on)
    plan.key = _key(conditions, names, query, on)
    if right.args.get("version") is not None:
        _temporal(plan, right.args["version"], conditions, query)
    elif (join.args.get("method") or "").upper() == "ASOF":
        _asof(plan, conditions, query, on)
    else:
        _interval(plan, conditions, query, on, interval)
    plan.right_fields = sorted({c.name for c in select.find_all(exp.Column) if c.table == names[1]})
    return plan


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node.this if isinstance(node, exp.Paren) else node]


def _sides(a: exp.Expression, b: exp.Expression, names: tuple) -> tuple | None:
    """``(left column, right column)`` when ``a`` and ``b`` are columns of the two sides."""
    if isinstance(a, exp.Column) and isinstance(b, exp.Column):
        if (a.table, b.table) == names:
            return a, b
        if (b.table, a.table) == names:
            return b, a
    return None


def _key(conditions: list, names: tuple, query: str, on: exp.Expression) -> str:
    """The one ``a.k = b.k`` of ON (taken out of ``conditions``)."""
    for c in conditions:
        pair = _sides(c.this, c.expression, names) if isinstance(c, exp.EQ) else None
        if pair is not None:
            if pair[0].name != pair[1].name:
                raise error(query, c, f"the key is named {pair[0].name!r} and {pair[1].name!r}: name it alike "
                                      f"on both sides (copies route both inputs by one field)")
            conditions.remove(c)
            return pair[0].name
    raise error(query, on, f"ON needs the key's equality, {names[0]}.<key> = {names[1]}.<key>")


def _only(conditions: list, query: str, on: exp.Expression, what: str) -> exp.Expression:
    """The one condition of ON besides the key's equality."""
    if not conditions:
        raise error(query, on, f"ON needs {what} besides the key's equality")
    if len(conditions) > 1:
        raise error(query, conditions[1], f"ON takes the key's equality and {what}; put other conditions in WHERE")
    return conditions[0]


def _same_time(plan: JoinPlan, a: exp.Column, b: exp.Column, query: str) -> None:
    if a.name != b.name:
        raise error(query, b, f"the time is named {a.name!r} and {b.name!r}: name it alike on both sides")
    plan.ts_field = a.name


def _asof(plan: JoinPlan, conditions: list, query: str, on: exp.Expression) -> None:
    c = _only(conditions, query, on, "one time comparison, a.ts >= b.ts (or <=)")
    pair = _sides(c.this, c.expression, plan.names) if isinstance(c, (exp.GTE, exp.LTE)) else None
    if pair is None:
        raise error(query, c, f"ASOF JOIN compares the times: {plan.names[0]}.ts >= {plan.names[1]}.ts")
    _same_time(plan, *pair, query)
    left_first = c.this is pair[0]
    plan.kind = "asof"
    plan.direction = "backward" if isinstance(c, exp.GTE) == left_first else "forward"


def _temporal(plan: JoinPlan, version: exp.Expression, conditions: list, query: str) -> None:
    at = version.expression
    if conditions:
        raise error(query, conditions[0], "FOR SYSTEM_TIME AS OF joins on the key alone; put other "
                                          "conditions in WHERE")
    if not (isinstance(at, exp.Column) and at.table == plan.names[0]):
        raise error(query, version, f"FOR SYSTEM_TIME AS OF takes the left side's time, "
                                    f"{plan.names[0]}.ts")
    plan.kind, plan.ts_field = "temporal", at.name


def _interval(plan: JoinPlan, conditions: list, query: str, on: exp.Expression, interval) -> None:
    c = _only(conditions, query, on, "a time range, a.ts BETWEEN b.ts - INTERVAL ... AND b.ts + ...")
    if not isinstance(c, exp.Between) or not isinstance(c.this, exp.Column):
        raise error(query, c, "a streaming JOIN bounds the times: "
                              f"{plan.names[0]}.ts BETWEEN {plan.names[1]}.ts - INTERVAL ... AND ...")
    subject = c.this
    low, base = _offset(c.args["low"], query, interval)
    high, base_high = _offset(c.args["high"], query, interval)
    pair = _sides(subject, base, plan.names)
    if pair is None or base_high.sql() != base.sql():
        raise error(query, c, "BETWEEN's bounds are the other side's time plus or minus a duration")
    _same_time(plan, *pair, query)
    # subject - base in [low, high]; the operator's bounds are of right ts - left ts
    plan.kind = "interval"
    plan.bounds = (-high, -low) if subject is pair[0] else (low, high)


def _offset(node: exp.Expression, query: str, interval) -> tuple[int, exp.Expression]:
    """``b.ts``, ``b.ts + X`` or ``b.ts - X`` as ``(signed X in ms, b.ts)``."""
    if isinstance(node, exp.Paren):
        return _offset(node.this, query, interval)
    if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.this, exp.Column):
        amount = node.expression
        ms = int(amount.this) if isinstance(amount, exp.Literal) and not amount.is_string and \
            amount.this.isdigit() else interval(amount, query)
        return (ms if isinstance(node, exp.Add) else -ms), node.this
    return 0, node


class Flatten:
    """A join's ``{"left", "right", "ts"}`` as one row of qualified fields (picklable); an inner
    join's left row without a match is dropped (a flat_map's empty list)."""

    def __init__(self, names: tuple[str, str], outer: bool, right_fields: list[str]) -> None:
        self.names, self.outer, self.right_fields = names, outer, list(right_fields)

    def __call__(self, t: dict) -> list:
        right = t["right"]
        if right is None and not self.outer:
            return []
        ln, rn = self.names
        row = {f"{ln}.{k}": v for k, v in t["left"].items()}
        if right is None:
            row.update({f"{rn}.{k}": None for k in self.right_fields})
        else:
            row.update({f"{rn}.{k}": v for k, v in (right.items() if isinstance(right, dict) else ())})
        row["ts"] = t["ts"]
        return [row]


def joined(plan: JoinPlan, left: Stream, right: Stream) -> Stream:
    """The join operator of ``plan`` over the two sources, its rows flat."""
    if plan.kind == "interval":
        lower, upper = plan.bounds
        out = left.join_interval(right, by=plan.key, lower=lower, upper=upper, ts_field=plan.ts_field)
    elif plan.kind == "asof":
        out = left.join_asof(right, by=plan.key, on=plan.ts_field, direction=plan.direction)
    else:
        out = left.lookup(right, key=plan.key, as_of=True, on=plan.ts_field)
    return out.flat_map(Flatten(plan.names, plan.outer, plan.right_fields))

