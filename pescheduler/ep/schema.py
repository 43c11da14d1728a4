"""Stream schemas: what ``push_event`` checks before anything changes, on every provider."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TS_FIELD = "ts"

_TYPES: dict[str, type] = {"int": int, "integer": int, "long": int, "float": float, "double": float,
                           "number": float, "str": str, "string": str, "bool": bool, "boolean": bool}


# -- schemas ---------------------------------------------------------------------------------
class SchemaError(ValueError):
    """An event that does not fit its stream's schema; the message names the field and the fix."""


class Schema:
    """Field name -> type (``int``, ``float``, ``str``, ``bool``, or those names as strings).

    An ``int`` is accepted for a ``float`` field; ``bool`` is not an ``int``.
    Events carry their time under ``ts`` (milliseconds, an int), so a schema
    cannot declare that field.
    """

    def __init__(self, stream: str, fields: Mapping[str, Any]) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(f"stream {stream!r}: a schema is a dict {{field: type}}, got {fields!r}")
        if TS_FIELD in fields:
            raise ValueError(f"stream {stream!r}: {TS_FIELD!r} is the event time given to push_event; "
                             f"rename that field")
        self.stream = stream
        self.fields = {name: self._type(name, t) for name, t in fields.items()}

    def _type(self, name: str, t: Any) -> type:
        t = _TYPES.get(t, t) if isinstance(t, str) else t
        if t not in (int, float, str, bool):
            raise ValueError(f"stream {self.stream!r}: field {name!r} has type {t!r}; "
                             f"use int, float, str or bool")
        return t

    def event(self, payload: Any, ts: Any) -> dict:
        """The event to process: ``payload`` checked, with its time under ``ts``."""
        if type(ts) is not int:             # (a bool too: _check_ts says why)
            self._check_ts(ts)
        self._check_payload(payload, ())
        if type(payload) is dict:           # half the cost of the display below
            event = payload.copy()
            event[TS_FIELD] = ts
            return event
        return {**payload, TS_FIELD: ts}

    def check_event(self, event: Any) -> None:
        """Check an event that carries its time (what a deployed source reads)."""
        if isinstance(event, Mapping):
            if TS_FIELD not in event:
                raise SchemaError(f"stream {self.stream!r}: field {TS_FIELD!r} (event time, int ms) "
                                  f"is missing")
            self._check_ts(event[TS_FIELD])
        self._check_payload(event, (TS_FIELD,))

    def _check_ts(self, ts: Any) -> None:
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise SchemaError(f"stream {self.stream!r}: the event time {TS_FIELD!r} must be int "
                              f"(milliseconds), got {type(ts).__name__} {ts!r}")

    def _check_payload(self, payload: Any, also: tuple) -> None:
        # The hot path of push_event: a dict whose values have exactly the declared types
        # (an int for a float field too) and no other field is checked in one pass.
        fields = self.fields
        if type(payload) is dict and len(payload) <= len(fields):
            for name, t in fields.items():
                tv = type(payload.get(name))
                if tv is not t and not (tv is int and t is float):
                    break
            else:
                if len(payload) == len(fields):
                    return
        if not isinstance(payload, Mapping):
            raise SchemaError(f"stream {self.stream!r}: an event is a dict of {self.describe()}, "
                              f"got {type(payload).__name__} {payload!r}")
        for name, t in self.fields.items():
            if name not in payload:
                raise SchemaError(f"stream {self.stream!r}: field {name!r} ({t.__name__}) is missing")
            value = payload[name]
            ok = isinstance(value, t) and not (t is int and isinstance(value, bool))
            if t is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise SchemaError(f"stream {self.stream!r}: field {name!r} must be {t.__name__}, "
                                  f"got {type(value).__name__} {value!r}")
        extra = [k for k in payload if k not in self.fields and k not in also]
        if extra:
            raise SchemaError(f"stream {self.stream!r}: unknown field {extra[0]!r}; "
                              f"the schema is {self.describe()}")

    def describe(self) -> str:
        return "{" + ", ".join(f"{k}: {t.__name__}" for k, t in self.fields.items()) + "}"

    def __repr__(self) -> str:
        return f"Schema({self.stream!r}, {self.describe()})"
