"""A memory window's pane read by key group in two passes (operators/pane_index.py): the index
(each layer's key groups, the keys that take a place, the count) and the pick of the groups a
checkpoint writes whole, against ``pane_layers.pane_groups`` (the one pass it replaces for plain
dicts); the oldest layer's groups kept between checkpoints and only appended keys hashed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pescheduler.operators.pane_index as pane_index
import pescheduler.state.groups as groups
from pescheduler.operators.pane_index import OldestGroups, index_pane, pick_groups
from pescheduler.operators.pane_layers import pane_groups
from pescheduler.state import KEY_GROUPS, key_group
from pescheduler.state.groups import pack_namespaced_chunks

keys = st.one_of(st.integers(0, 400), st.text(alphabet="abcdef", max_size=3))
layer = st.dictionaries(keys, st.lists(st.integers(0, 9), min_size=1, max_size=2), max_size=300)


def listed(picked: dict) -> dict:
    """``pick_groups``' groups as ``pane_groups`` gives them: ``{group: (positions, {key: slots})}``."""
    return {g: (c.places.tolist(), {**{k: v for chunk in c.chunks for k, v in chunk.items()}, **c.over})
            for g, c in picked.items()}


@settings(max_examples=200, deadline=None)
@given(st.lists(layer, min_size=1, max_size=5), st.frozensets(st.integers(0, KEY_GROUPS - 1), max_size=12))
def test_the_index_and_pick_give_what_one_pass_gives(layers, wanted):
    """Every group, or some: each key at its place in the merged order with its newest slots, the
    pane's count and the groups it holds, as ``pane_groups`` gives them."""
    layers = tuple(layers)
    whole, count = pane_groups(layers)
    index = index_pane(0, layers, OldestGroups())
    assert index.count == count
    assert set(index.present.nonzero()[0].tolist()) == set(whole)
    assert listed(pick_groups(index)) == whole
    assert listed(pick_groups(index, wanted)) == {g: v for g, v in whole.items() if g in wanted}


@settings(max_examples=100, deadline=None)
@given(st.lists(layer, min_size=1, max_size=4))
def test_a_picked_group_packs_to_the_bytes_one_pass_gives_in_dicts_of_at_most_a_chunk(layers):
    """The pick's groups hold no dict of more than ``PACK_CHUNK`` keys (here 3; a group's keys in one
    dict cost a resize now and then: at 10^7 keys 4-18 ms each, holding the GIL), and each packs
    to the very bytes ``pane_groups``' group packs to (the file format is unchanged), its chunks
    let go as packed."""
    layers = tuple(layers)
    whole, _count = pane_groups(layers)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(groups, "PACK_CHUNK", 3)      # a group of a few keys in several chunks
        picked = pick_groups(index_pane(0, layers, OldestGroups()))
        assert picked.keys() == whole.keys()
        for g, chunked in picked.items():
            assert all(len(chunk) <= 3 for chunk in chunked.chunks)
            assert pack_namespaced_chunks({5: chunked}) == pack_namespaced_chunks({5: whole[g]})
            assert chunked.chunks == [] and chunked.over == {}


def test_the_oldest_layers_groups_are_kept_and_only_keys_appended_since_hashed(monkeypatch):
    """The oldest layer grows by appends (a layer absorbed into it: ``dict.update``, slots of keys
    it held replaced in place): the next index hashes only the keys appended. Keys popped from it
    (a rescale's purge) after ``forget_layer``: hashed again whole, in its new order."""
    hashed, real = [], pane_index._group_array
    monkeypatch.setattr(pane_index, "_group_array", lambda np, part: hashed.append(len(part)) or real(np, part))
    oldest = OldestGroups()
    base = {f"k{i}": [i] for i in range(10_000)}
    index_pane(7, (base,), oldest)
    assert sum(hashed) == 10_000
    hashed.clear()
    base.update({f"k{i}": [-i] for i in range(9_000, 12_000)})      # 1,000 held, 2,000 appended
    index = index_pane(7, (base,), oldest)
    assert sum(hashed) == 2_000
    assert index.groups[0].tolist() == [key_group(k) for k in base]
    oldest.forget_layer(base)
    for i in range(0, 12_000, 3):
        base.pop(f"k{i}")
    base.update({f"n{i}": [i] for i in range(4_000)})               # as many back: its size the same
    base["k0"] = [0]                                                # popped, then put back at the end
    hashed.clear()
    index = index_pane(7, (base,), oldest)
    assert sum(hashed) == len(base)
    assert index.groups[0].tolist() == [key_group(k) for k in base]
    assert listed(pick_groups(index)) == pane_groups((base,))[0]
