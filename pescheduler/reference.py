"""The reference of what plug-ins provide, read from the code: signatures and docstrings.

``python -m pescheduler plugins --describe NAME`` prints one entry;
docs/reference.md is :func:`markdown` of the built-in ones (a test fails when
it is stale; regenerate it with ``python -m pescheduler.reference > docs/reference.md``).
A parameter's meaning is the docstring's first sentence naming it (````name````),
so documenting a parameter in the class docstring documents it here too.

Example::

    from pescheduler.plugins import load_plugins
    [entry] = describe(load_plugins(), "parquet")
    entry.params[0]        # Param(name='path', type='str | os.PathLike', default='required', meaning=...)
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass

from . import config
from .collection_aggregates import PARAMETRISED
from .plugins import Plugins, internal, load_plugins

KINDS = ("source", "operator", "sink", "aggregate", "policy")
REQUIRED = "required"


@dataclass(frozen=True)
class Param:
    """One parameter: name, type (as annotated), default (``required`` when none), meaning."""

    name: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Entry:
    """What one plug-in name provides: kind, name, the docstring's first line, parameters."""

    kind: str
    name: str
    summary: str
    params: tuple[Param, ...]
    origin: str = ""


def entries(found: Plugins, everything: bool = False) -> list[Entry]:
    """Every operator, source, sink, aggregate and policy of ``found`` (``ep_*`` ones with ``everything``)."""
    out = [_operator(kind, name, cls, found.origins.get(found.operator_origins.get((kind, name), ""), ""))
           for (kind, name), cls in found.operators.items() if everything or not internal(name)]
    out += [_aggregate(agg) for agg in found.aggregates.values()]
    out += [_parametrised(name, *about) for name, about in PARAMETRISED.items()]
    out += [_policy(name, module, found.origins.get(name, "")) for name, module in found.policies().items()]
    return sorted(out, key=lambda e: (KINDS.index(e.kind), e.name))


def describe(found: Plugins, name: str) -> list[Entry]:
    """The entries called ``name`` (``jsonl`` is a source and a sink)."""
    return [e for e in entries(found, everything=True) if e.name == name]


def _operator(kind: str, name: str, cls: type, origin: str) -> Entry:
    doc = inspect.getdoc(cls) or ""
    return Entry(kind, name, _summary(doc), tuple(_params(cls, doc)), origin)


def _params(cls: type, doc: str) -> list[Param]:
    """``__init__``'s parameters; ``**kwargs`` passed on to a base class's ``__init__`` adds its."""
    found: list[Param] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        docs = doc + "\n\n" + (inspect.getdoc(klass) or "")
        found += [_param(p, docs) for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
                  and p.name not in {f.name for f in found}]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return found


def _param(p: inspect.Parameter, doc: str) -> Param:
    kind = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
    default = REQUIRED if p.default is p.empty else repr(p.default)
    return Param(p.name, "" if p.annotation is p.empty else kind, default, meaning(p.name, doc))


def meaning(name: str, doc: str) -> str:
    """The first sentence of ``doc`` that names ``name`` as ````name```` or ````name=...````, on one line."""
    named = re.compile(r"``%s(=[^`]*)?``" % re.escape(name))
    sentences = _sentences(doc)
    found = [s for s in sentences if named.match(s)] or [s for s in sentences if named.search(s)]
    return _clip(found[0]) if found else ""


def _sentences(doc: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", re.sub(r"\s+", " ", doc)) if s.strip()]


def first_sentence(doc: str) -> str:
    """The first sentence of ``doc`` (its summary, in listings)."""
    return (_sentences(doc.strip().split("\n\n", 1)[0]) or [""])[0]


def _clip(text: str, chars: int = 300) -> str:
    return text if len(text) <= chars else text[:chars - 1].rstrip() + "…"


def _summary(doc: str) -> str:
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ") if doc else ""


def _aggregate(agg) -> Entry:
    uses = ", ".join(u if isinstance(u, str) else u.name for u in getattr(agg, "uses", ()))
    summary = getattr(agg, "doc", "") or (f"computed from {uses}" if uses else "")
    form = f'("{agg.name}", field)' if getattr(agg, "needs_field", True) else f'("{agg.name}", any field)'
    return Entry("aggregate", agg.name, summary,
                 (Param("field", "str", REQUIRED, f"the field it aggregates; written {form} in aggregates={{...}}"),))


def _parametrised(name: str, param: str, kind: str, meaning: str, summary: str) -> Entry:
    """``percentile``/``approx_percentile``/``top_k``: requested as ``(name, field, parameter)``."""
    form = f'("{name}", field, {param})'
    return Entry("aggregate", name, summary,
                 (Param("field", "str", REQUIRED, f"the field it aggregates; written {form} in aggregates={{...}}"),
                  Param(param, kind, REQUIRED, meaning)))


def _policy(name: str, module, origin: str) -> Entry:
    """A policy's settings: ``pescheduler.policies.<name>.*`` as declared, meanings from its module doc."""
    doc = inspect.getdoc(module) or ""
    settings = config.section(f"policies.{name}") if f"policies.{name}" in config.declared_keys() else {}
    return Entry("policy", name, _summary(doc),
                 tuple(Param(key, type(value).__name__, repr(value), meaning(key, doc))
                       for key, value in sorted(settings.items()) if not isinstance(value, dict)), origin)


# -- docs/reference.md -------------------------------------------------------------------------------

def markdown(found: Plugins) -> str:
    """docs/reference.md: every built-in operator, source, sink, aggregate and policy (this distribution's)."""
    lines = ["# Reference: operators, sources, sinks, aggregates, policies", "",
             "Generated from the code (signatures and docstrings) by `python -m pescheduler.reference`; "
             "`python -m pescheduler plugins --describe NAME` prints one entry, installed plug-ins' too. "
             "Do not edit by hand: a test fails when this page and the code differ.", ""]
    from .aggregates import BUILTINS

    for entry in entries(found):
        if entry.origin.startswith("pescheduler ") or (entry.kind == "aggregate" and
                                                       (entry.name in BUILTINS or entry.name in PARAMETRISED)):
            lines += _section(entry)
    return "\n".join(lines).rstrip() + "\n"


def _section(entry: Entry) -> list[str]:
    lines = [f"## {entry.kind} `{entry.name}`", "", entry.summary, ""] if entry.summary else \
        [f"## {entry.kind} `{entry.name}`", ""]
    if entry.params:
        lines += ["| parameter | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{p.name}` | {_cell(p.type)} | {_cell(p.default)} | {_cell(p.meaning)} |" for p in entry.params]
        lines.append("")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.stdout.write(markdown(load_plugins()))
