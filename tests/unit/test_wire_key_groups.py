"""wire.key_group: keys Python holds equal are one key group, however their parts were built."""

from __future__ import annotations

import pickle
import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pescheduler.wire import _canonical, key_group, key_hash

# a key's shape: an atom or a tuple of shapes; strings of a few letters (1-char latin-1 ones are
# CPython singletons, "€" is not), so that equal strings meet often, shared or not
_ATOMS = st.one_of(st.integers(-2, 3), st.text(alphabet="ab€é", max_size=3), st.sampled_from([2.5, -0.5, None, b"xy"]))
SHAPES = st.recursive(_ATOMS, lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=8)


def _copy(s: str) -> str:
    """An equal string that is another object (where CPython lets it be one)."""
    return (s + ".")[:-1]


def _build(shape, data, pool: dict | None):
    """An equal key: strings shared through ``pool`` (or each a fresh copy when None), an integer
    as an int, a bool, an integral float or a numpy int at random."""
    if type(shape) is tuple:
        return tuple(_build(part, data, pool) for part in shape)
    if type(shape) is str:
        return _copy(shape) if pool is None else pool.setdefault(shape, shape)
    if type(shape) is int:
        kinds = [int, float, np.int64, np.int16] + ([bool] if shape in (0, 1) else [])
        return data.draw(st.sampled_from(kinds))(shape)
    return shape


@settings(max_examples=300, deadline=None)
@given(shape=SHAPES, data=st.data())
def test_equal_keys_are_one_key_group_however_built(shape, data):
    """``(s, s)`` and ``(s, a copy of s)`` are equal: pickle's memo wrote the second ``s`` of the
    first as a back-reference, so the two hashed apart and one key's state split over two copies."""
    shared, fresh = _build(shape, data, {}), _build(shape, data, None)
    assert shared == fresh
    assert key_group(shared) == key_group(fresh), (shared, fresh)


def test_a_shared_string_in_a_tuple_is_no_other_key_group():
    s = "car-0000042"
    assert key_group((s, s)) == key_group((s, _copy(s)))
    assert key_group(((s,), s)) == key_group(((s,), _copy(s)))
    assert key_group(np.str_(s)) == key_group(s)


def _old_key_hash(key) -> int:
    """wire.key_hash before tuples were pickled memo-free (main at 15e4a2c) for keys it takes."""
    key = _canonical(key)
    return zlib.crc32(pickle.dumps(key, protocol=4))


# key groups on main at 15e4a2c: a checkpoint's key groups of these keys restore where they were
_BEFORE = [(0, 0), (7, 93), (-5, 23), ("car-0042", 21), ("", 0), ("é", 91), (2.5, 36), (-0.5, 116),
           (1e20, 29), (None, 110), (b"raw", 124), (np.int64(7), 93), (True, 44), (3.0, 78),
           ((1, "a"), 0), (("car-1", 3), 30), (((1,), 2.5), 18), (("ab", "cd", None), 97), ((2, 3.0), 31),
           (frozenset({1}), 3)]


def test_key_groups_of_keys_without_shared_parts_are_those_they_were():
    assert [(k, key_group(k)) for k, _ in _BEFORE] == _BEFORE


@settings(max_examples=200, deadline=None)
@given(key=st.one_of(st.floats(allow_nan=False).filter(lambda f: not f.is_integer()), st.none(),
                     st.binary(max_size=6), st.frozensets(st.integers(0, 9), max_size=3),
                     st.tuples(st.text(max_size=4), st.integers(), st.binary(max_size=3))))
def test_the_hash_of_a_key_that_is_not_a_tuple_or_has_no_shared_part_is_unchanged(key):
    """Non-tuple keys hash as before; so do tuples of distinct strings, numbers and bytes (the
    usual tuple key): a checkpoint written before this keeps its key groups."""
    assert key_hash(key) == _old_key_hash(key)
