"""Key -> state-slot index for the columnar window: vectorised for every batch, whatever its dictionary.

Each batch's key column is mapped to dense slots (first seen first) that stay
fixed for the operator's life. Sources and channels hand a new dictionary
(or none) with every batch, so the mapping cannot be cached per dictionary;
mapping the batch's distinct keys one by one in Python was half the columnar
pipeline's time. Here the batch's distinct keys are hashed in Arrow together
with the keys already known: ``dictionary_encode(known + distinct)`` gives the
known keys their own slots back (they are unique, in slot order) and every
unseen key the next free slot, in order of first appearance, in one C pass.
(Measured against ``index_in`` on the known keys plus a second pass for the
misses, and a sorted numpy index with ``searchsorted``: both slower on the
connected-car workload; figures in docs/expressions.md.)

That pass rehashes the known keys, so when they far outnumber the batch's
distinct keys (a long tail of old keys) the per-key Python dict is cheaper
and is used instead: no batch costs more than it did before. Arrow's equality
matches Python's only within integers and within strings, so other key types
(floats: ``0.0 == -0.0``, NaN; mixed types) always take the dict.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pescheduler.state.groups import key_groups

# Arrow hashing costs about a sixth of a Python dict look-up per key (L): above this many known keys
# per distinct key in the batch (with a margin), rehashing the known ones would cost more than the dict.
_ARROW_RATIO = 4
GROUP_SLICE = 4096          # keys whose groups are made per call (KeySlots.grouped)


def _arrow_equal(t: Any) -> bool:
    """Key types whose Arrow equality is Python's (so both paths give the same slots)."""
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


class KeySlots:
    """``keys[slot]`` (Python values, first seen first), the dict back, and the keys as one Arrow array."""

    def __init__(self) -> None:
        self.keys: list = []
        self.index: dict = {}
        self.groups = bytearray()               # the first keys' key groups, by slot (:meth:`grouped`)
        self._grouping = threading.Lock()
        self._array: Any = None                 # pa.Array of ``keys`` (None: rebuild when next needed)

    def __len__(self) -> int:
        return len(self.keys)

    def grouped(self, upto: int) -> np.ndarray:
        """The key groups of the first ``upto`` keys, by slot (uint8): a rescale's export picks the
        moving keys with them in numpy. Computed once per key, a slice at a time, by whichever
        thread asks first: a checkpoint's writer for the keys of its snapshot, off the PE's turn
        (at 10^6 keys, 0.3-0.5 s of crcs), the export in the turn only for the keys since. Not on
        a key's arrival: a batch of new keys folded 15-25 % slower with it."""
        while (start := len(self.groups)) < upto:
            end = min(upto, start + GROUP_SLICE)
            made = bytes(key_groups(self.keys[start:end]))
            with self._grouping:            # the other thread may have made them meanwhile
                if len(self.groups) == start:
                    self.groups += made
        return np.frombuffer(self.groups[:upto], dtype=np.uint8)     # a copy: the bytearray may grow

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_grouping"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._grouping = threading.Lock()

    def array(self) -> Any:
        """All keys, in slot order, as an Arrow array (built once per change, not per batch)."""
        if self._array is None or len(self._array) != len(self.keys):
            self._array = pa.array(self.keys)
        return self._array

    def slots(self, values: Any) -> np.ndarray:
        """Slot of each of ``values`` (a batch's distinct keys, no nulls); unseen keys get new slots."""
        if (len(self.keys) <= _ARROW_RATIO * len(values) and _arrow_equal(values.type)
                and not values.null_count):        # a null in a dictionary's values: a None key, as rows have
            if not self.keys:
                return self._hashed(values.slice(0, 0), values)
            known = self.array()
            same = self._as(values, known.type)
            if same is not None:
                return self._hashed(known, same)
        return self.looked_up(values.to_pylist())

    @staticmethod
    def _as(values: Any, t: Any) -> Any:
        """``values`` in the known keys' type (int32 -> int64, large_string -> string), None if not exact."""
        if values.type == t:
            return values
        if not _arrow_equal(t) or pa.types.is_integer(t) != pa.types.is_integer(values.type):
            return None
        try:
            return pc.cast(values, t)            # safe cast: an overflow raises, it does not wrap
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None

    def _hashed(self, known: Any, values: Any) -> np.ndarray:
        """One Arrow hash pass over known + values; new keys are the encoded dictionary's tail."""
        k = len(known)
        encoded = pc.dictionary_encode(pa.concat_arrays([known, values]))
        if len(encoded.dictionary) > k:
            new = encoded.dictionary.slice(k)
            fresh = new.to_pylist()
            self.index.update(zip(fresh, range(k, k + len(fresh))))
            self.keys.extend(fresh)
            self._array = encoded.dictionary
        return encoded.indices.to_numpy()[k:].astype(np.int64)

    def looked_up(self, values: list) -> np.ndarray:
        """The per-key dict path (a long tail of known keys, or key types Arrow compares otherwise;
        a rescale's imported rows: ``ColumnarPanes.add_rows``)."""
        index, keys = self.index, self.keys
        out = np.empty(len(values), dtype=np.int64)
        for i, k in enumerate(values):
            j = index.get(k)
            if j is None:
                j = index[k] = len(keys)
                keys.append(k)
            out[i] = j
        return out
