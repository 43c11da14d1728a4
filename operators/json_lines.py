"""An Arrow batch as JSON lines, byte for byte what the ``jsonl`` sink writes for its rows, without rows.

Why: the columnar connected-car app spent most of its end-to-end time in its
sink, not its pipeline: each window result became a dict (``to_pylist``) and a
``json`` call (about 2.3 s and 4.8 s of the sink PE's 9 s, profiled, for
337 k results; issue 34's point 5). Here each column is formatted once by an
Arrow kernel and the lines are joined by one more, so the batch's text is one
buffer.

Exactly the row path's bytes (``JSONEncoder(separators=(",", ":"),
default=str)``, ``ensure_ascii``), so a column is formatted by Arrow only
where Arrow's text is provably Python's:

- integers: the same digits; booleans ``true``/``false``; null ``null``;
- floats of magnitude 1e-4 to 1e10, and zeros: Arrow's shortest round-trip
  digits are ``repr``'s, in the same fixed notation, but for an integral value
  (``100`` against ``100.0``: ``.0`` is added). Outside that range the two
  switch to exponents at different points (measured: from 1e10, below 1e-4);
- strings of printable ASCII without ``"`` or ``\\``: quoted as they are.

Any other column (a float out of that range, NaN, a string needing escapes,
timestamps, nested values) is encoded value by value by the row path's own
encoder: the same bytes, at the row path's cost for that column only.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_PLAIN = r"[^\x20\x21\x23-\x5b\x5d-\x7e]"     # anything json would escape (or ensure_ascii would)


def arrow_lines(batch: Any, encode: Callable[[Any], str]) -> bytes:
    """``batch``'s rows as the lines ``"\\n".join(map(encode, batch.to_pylist())) + "\\n"`` would be
    (``encode``: the row path's encoder, for the columns Arrow cannot format exactly)."""
    names = batch.schema.names
    if not batch.num_rows:
        return b""
    if len(set(names)) != len(names):            # a row dict keeps the last of equal names
        return ("\n".join(map(encode, batch.to_pylist())) + "\n").encode()
    parts: list = []
    for i, name in enumerate(names):
        parts.append(("{" if i == 0 else ",") + json.dumps(name) + ":")
        parts.append(_column(batch.column(i), encode))
    parts.append("}\n")
    text = pc.binary_join_element_wise(*parts, "")
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32, count=len(text) + 1, offset=4 * text.offset)
    return text.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]]


def _column(arr: Any, encode: Callable[[Any], str]) -> Any:
    """The JSON text of each value of ``arr``, as a string array."""
    t = arr.type
    if pa.types.is_dictionary(t):
        text = _column(arr.dictionary, encode)
        return pc.fill_null(pc.take(text, arr.indices), "null")
    text = _formatted(arr, t)
    if text is None:                             # the row path's encoder, value by value
        return pa.array([encode(v) for v in arr.to_pylist()], pa.string())
    return pc.fill_null(text, "null") if arr.null_count else text


def _formatted(arr: Any, t: Any) -> Any:
    """Arrow's text of ``arr`` where it is exactly ``json``'s, else None."""
    if pa.types.is_integer(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_boolean(t):
        return pc.if_else(arr, "true", "false")
    if pa.types.is_floating(t) and not pa.types.is_float16(t):
        if pa.types.is_float32(t):               # json writes the float64 it widens to: other digits
            return None
        magnitude = np.abs((arr.drop_null() if arr.null_count else arr).to_numpy())   # NaN: not in range
        if not ((magnitude == 0) | ((magnitude >= 1e-4) & (magnitude < 1e10))).all():
            return None
        text = pc.cast(arr, pa.string())
        integral = pc.invert(pc.match_substring(text, "."))
        return pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if pc.any(pc.match_substring_regex(arr, _PLAIN)).as_py():
            return None
        return pc.binary_join_element_wise('"', pc.cast(arr, pa.string()), '"', "")
    return None
