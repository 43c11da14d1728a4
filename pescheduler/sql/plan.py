"""A checked SELECT as a :class:`QueryPlan`: the operators it needs, in order, nothing built yet.

One SELECT reads one source, through at most one window table function
(``TUMBLE``, ``HOP``, ``SESSION``), and becomes

    filter (WHERE) -> map (expressions aggregated) -> key_by (GROUP BY key)
    -> window (the aggregates) -> filter (HAVING) -> map (SELECT's expressions) -> projection

where every step that has nothing to do is left out; or reads two sources
through one JOIN (:mod:`.joins`: interval, as-of and temporal joins), filtered and
projected. A clause the plan has no step for (ORDER BY, LIMIT, DISTINCT,
sub-queries, ...) is an error naming it, never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from ..expr import Expr
from ..timeutil import parse_duration
from .expressions import Translator
from .joins import JoinPlan, plan_join
from .parse import WINDOW_FUNCTIONS, error

AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg",
              exp.VariancePop: "var", exp.StddevPop: "stddev"}
"""SQL aggregate -> the window operator's aggregate of the same meaning (``var`` is the population one)."""
WINDOW_FIELDS = ("window_start", "window_end")
_ALLOWED = {"expressions", "from_", "where", "group", "having", "joins"}
_UNITS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}


@dataclass
class Window:
    """The window table function: ``kind`` (tumble/hop/session), its time field and sizes in ms."""

    kind: str
    ts_field: str
    size: int
    slide: int | None = None

    def params(self) -> dict[str, Any]:
        """The ``Stream.window`` arguments of this window."""
        if self.kind == "session":
            return {"gap": self.size, "ts_field": self.ts_field}
        return {"size": self.size, "slide": self.slide, "ts_field": self.ts_field}


@dataclass
class QueryPlan:
    """One SELECT, ready to build: see the module docstring for the order of the steps."""

    source: str
    where: Expr | None = None
    inputs: dict[str, Expr] = field(default_factory=dict)       # hidden fields an aggregate reads
    key: str | None = None
    window: Window | None = None
    aggregates: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    having: Expr | None = None
    computed: dict[str, Expr] = field(default_factory=dict)     # output name -> expression
    columns: list[str] = field(default_factory=list)           # the output's fields, in order
    join: JoinPlan | None = None                               # FROM source JOIN another


def plan_select(select: exp.Expression, query: str) -> QueryPlan:
    """Check ``select`` clause by clause and plan it (a :class:`SQLError` for what cannot run)."""
    if not isinstance(select, exp.Select):
        raise error(query, select, f"{select.key.upper()} is not supported: write a SELECT, or "
                                   f"SELECTs joined by UNION ALL")
    for name, value in select.args.items():
        if value and name not in _ALLOWED:
            node = value[0] if isinstance(value, list) else value
            node = node if isinstance(node, exp.Expression) else select
            what = {"joins": "JOIN", "with_": "WITH", "order": "ORDER BY", "group": "GROUP BY"}.get(name, name)
            raise error(query, node, f"{what.upper().rstrip('_')} is not supported in a streaming query")
    source, window = _from(select, query)
    plan = QueryPlan(source=source, window=window)
    if select.args.get("joins"):
        plan.join = plan_join(select, query, _interval)
        _check_joined(select, plan, query)
    translate = Translator(query, qualified=plan.join is not None)
    if select.args.get("where"):
        plan.where = translate(select.args["where"].this)
    _group(select, plan, query)
    _select_list(select, plan, query)
    return plan


def _check_joined(select: exp.Select, plan: QueryPlan, query: str) -> None:
    """A joined SELECT filters and projects; aggregating it is another query's work."""
    node = select.args.get("group") or next(select.find_all(exp.AggFunc), None)
    if node is not None:
        raise error(query, node, "a JOIN's SELECT does not aggregate: aggregate its result in another "
                                 "query (sources= takes any Stream)")


def _from(select: exp.Select, query: str) -> tuple[str, Window | None]:
    """The source's name and the window table function around it, if any."""
    source = select.args.get("from_")
    if source is None:
        raise error(query, select, "a SELECT needs FROM: a source or a window table function over one")
    table = source.this
    if isinstance(table, exp.Table) and isinstance(table.this, exp.Identifier):
        return table.name, None
    call = table.this if isinstance(table, exp.Table) else table
    if isinstance(call, exp.Anonymous) and call.name.upper() in WINDOW_FUNCTIONS:
        return _window(call, query)
    raise error(query, table, f"FROM {table.sql()} is not supported: FROM reads a source by name, or "
                              f"TUMBLE/HOP/SESSION(source, time field, INTERVAL ...)")


def _window(call: exp.Anonymous, query: str) -> tuple[str, Window]:
    kind = WINDOW_FUNCTIONS[call.name.upper()]
    args = call.expressions
    counts = {"tumble": 3, "hop": 4, "session": 3}
    if len(args) != counts[kind] or not all(isinstance(a, exp.Column) for a in args[:2]):
        raise error(query, call, f"{kind.upper()} takes (source, time field, "
                                 f"{'slide, size' if kind == 'hop' else 'INTERVAL'}), got {call.sql()}")
    sizes = [_interval(a, query) for a in args[2:]]
    if kind == "hop":
        slide, size = sizes
        if size % slide:
            raise error(query, args[3], f"HOP's size ({size} ms) must be a multiple of its slide ({slide} ms)")
        return args[0].name, Window("hop", args[1].name, size, slide)
    return args[0].name, Window(kind, args[1].name, sizes[0])


def _interval(node: exp.Expression, query: str) -> int:
    """``INTERVAL '60' SECOND`` (or a string ``'60s'``) in milliseconds."""
    if isinstance(node, exp.Interval):
        unit = node.text("unit").upper().rstrip("S")
        if unit in _UNITS and node.this.is_string and node.this.this.replace(".", "", 1).isdigit():
            return int(round(float(node.this.this) * _UNITS[unit]))
    elif isinstance(node, exp.Literal) and node.is_string:
        try:
            return parse_duration(node.this)
        except ValueError:
            pass
    raise error(query, node, f"not a duration: {node.sql()} (write e.g. INTERVAL '60' SECOND; units "
                             f"{', '.join(_UNITS)})")


def _group(select: exp.Select, plan: QueryPlan, query: str) -> None:
    """GROUP BY: the window's bounds and at most one key field."""
    group = select.args.get("group")
    keys = group.expressions if group else []
    if keys and plan.window is None:
        raise error(query, group, "GROUP BY over an unbounded stream needs a window: FROM TUMBLE(...), "
                                  "HOP(...) or SESSION(...)")
    others = [k for k in keys if not (isinstance(k, exp.Column) and k.name in WINDOW_FIELDS)]
    if plan.window is not None and len(others) == len(keys):
        raise error(query, group or select, "a windowed query groups by window_start (and window_end): "
                                            "add GROUP BY window_start")
    if len(others) > 1:
        raise error(query, others[1], "GROUP BY takes one key field besides the window's bounds")
    if others and not isinstance(others[0], exp.Column):
        raise error(query, others[0], f"GROUP BY {others[0].sql()}: group by a field (compute it in "
                                      f"another query first)")
    plan.key = others[0].name if others else None


def _select_list(select: exp.Select, plan: QueryPlan, query: str) -> None:
    """Aggregates to the window, the rest to expressions over the window's (or source's) rows."""
    names = _aggregates(select, plan, query)
    translate = Translator(query, names, qualified=plan.join is not None)
    if select.args.get("having"):
        if plan.window is None:
            raise error(query, select.args["having"], "HAVING needs a windowed GROUP BY")
        plan.having = translate(select.args["having"].this)
    for item in select.expressions:
        _output(item, plan, query, translate)


def _output(item: exp.Expression, plan: QueryPlan, query: str, translate: Translator) -> None:
    if isinstance(item, exp.Star):
        raise error(query, item, "SELECT * is not supported: name the fields (a stream has no fixed schema)")
    name = item.alias_or_name
    value = item.this if isinstance(item, exp.Alias) else item
    if not isinstance(item, exp.Alias) and not isinstance(value, exp.Column):
        raise error(query, item, f"name the result of {item.sql()} with AS")
    if name in plan.columns:
        raise error(query, item, f"the output field {name!r} is named twice")
    if plan.window is not None:
        _check_grouped(value, plan, query)
    expr = translate(value)
    if not (isinstance(value, exp.Column) and not value.table and value.name == name) and not (
            name in plan.aggregates and translate.names.get(value.sql()) == name):
        plan.computed[name] = expr
    plan.columns.append(name)


def _check_grouped(value: exp.Expression, plan: QueryPlan, query: str) -> None:
    """After a window only the key, the window's bounds and aggregates exist."""
    readable = {plan.key, *WINDOW_FIELDS}
    for column in value.find_all(exp.Column):
        if column.name not in readable and not any(isinstance(p, tuple(AGGREGATES))
                                                   for p in _ancestors(column, value)):
            raise error(query, column, f"{column.name!r} is neither grouped by nor aggregated")


def _ancestors(node: exp.Expression, top: exp.Expression):
    while node is not top and node.parent is not None:
        node = node.parent
        yield node


def _aggregates(select: exp.Select, plan: QueryPlan, query: str) -> dict[str, str]:
    """Every aggregate call of SELECT and HAVING as a window aggregate; SQL text -> its field."""
    names: dict[str, str] = {}
    scopes = [*select.expressions, select.args.get("having")]
    for scope in filter(None, scopes):
        for call in scope.find_all(exp.AggFunc):
            if call.sql() in names:
                continue
            alias = scope.alias if isinstance(scope, exp.Alias) and scope.this is call else None
            name = alias or f"_agg{len(names)}"
            plan.aggregates[name] = _aggregate(call, plan, query)
            names[call.sql()] = name
    if names and plan.window is None:
        raise error(query, next(select.find_all(exp.AggFunc)), "an aggregate over an unbounded stream needs "
                                                               "a window: FROM TUMBLE(...), HOP(...) or SESSION(...)")
    return names


def _aggregate(call: exp.AggFunc, plan: QueryPlan, query: str) -> tuple[str, str | None]:
    function = AGGREGATES.get(type(call))
    if function is None:
        hint = " (the window's var/stddev are the population ones: VAR_POP, STDDEV_POP)" if isinstance(
            call, (exp.Variance, exp.Stddev)) else ""
        raise error(query, call, f"aggregate {call.sql_name()} is not supported{hint}")
    arg = call.this
    if isinstance(arg, exp.Distinct):
        raise error(query, call, f"{call.sql_name()}(DISTINCT ...) is not supported")
    if function == "count":
        if not isinstance(arg, exp.Star):
            raise error(query, call, "COUNT(field) skips nulls, the window's count does not: write COUNT(*)")
        return "count", None
    if isinstance(arg, exp.Column):
        return function, arg.name
    hidden = f"_in{len(plan.inputs)}"
    plan.inputs[hidden] = Translator(query)(arg)
    return function, hidden
