"""A memory window's pane read by key group in two passes, so a checkpoint that writes deltas
packs only the few key groups it rewrites whole.

A checkpoint's writer needs each pane's keys counted (a new key's delta says its place in the
pane's merged order: ``PanesView._places``) and, for the groups it writes whole, their keys with
their places. ``pane_layers.pane_groups`` does both in one pass of Python per key and hashes every
key again at every checkpoint; a window's checkpoint of deltas rewrites only the 2-3 groups whose
turn it is, yet paid the pass and the pickle of all 128 (2.2-2.7 s at 10^6 keys, 39-47 s at 10^7).
Here:

    index   ──> each layer's keys' key groups in its order (numpy ``uint8``) and, for a layer over
                the oldest, which of its keys no layer under it holds (they take a place): the
                pane's count and the groups it holds. The oldest layer's groups are kept between
                checkpoints (:class:`OldestGroups`): it changes only by appends (``dict.update``
                of the layers absorbed into it, slots changed in place by the fold), so only its
                keys appended since are hashed
    pick    ──> the groups wanted, each a ``groups.ChunkedEntries`` (``pane_groups``' positions
                and ``{key: slots}``, in dicts of ``PACK_CHUNK`` keys): a slice of keys sorted by
                group with numpy, each group's share gathered and added in C, no step of Python
                per key; keys and slots read in order when every group is wanted, else the slots
                looked up for the wanted groups' keys only

Only panes whose layers are all plain dicts are read this way (a rescale's hidden keys, ``Left``,
and a columnar window's rows go through ``pane_groups``).
"""

from __future__ import annotations

import time
from itertools import islice
from typing import Any, Iterator

from pescheduler.state import KEY_GROUPS
from pescheduler.state.groups import ChunkedEntries, _group_array, _numpy
from pescheduler.state.incremental import slices
from pescheduler.state.memory import LEAVE_PACE_S

SLICE = 4096        # keys hashed or read per step, then the writer pauses (LEAVE_PACE_S): the PE takes the GIL
PICK_SLICE = 32768  # keys a pick sorts by group per step: 256 a group (its steps are one per group, each in C)


class PaneIndex:
    """One pane's layers (oldest first) as the index pass read them: each layer's key groups in its
    order (``groups``), for each layer but the oldest which of its keys take a place (``new``,
    numpy bool: no layer under it holds them), the keys the pane holds (``count``) and, per key
    group, whether the pane holds a key of it (``present``, numpy bool of ``KEY_GROUPS``)."""

    __slots__ = ("layers", "groups", "new", "count", "present")

    def __init__(self, layers: tuple[dict, ...], groups: list, new: list, count: int, present: Any) -> None:
        self.layers, self.groups, self.new, self.count, self.present = layers, groups, new, count, present


class OldestGroups:
    """Each pane's oldest layer's key groups, kept between checkpoints: ``{pane start: (layer,
    groups)}``, valid while that dict only grows by appends (``PaneLayers`` forgets a layer before
    popping keys from it: :meth:`forget_layer`; a pane dropped or replaced: :meth:`keep_only`)."""

    def __init__(self) -> None:
        self._of: dict[Any, tuple[dict, Any, Any]] = {}

    def groups(self, p: Any, layer: dict) -> tuple[Any, Any]:
        """``layer``'s key groups in its order and its keys per group (numpy, ``KEY_GROUPS``): the
        kept ones, with the keys appended since hashed and counted."""
        np = _numpy()
        kept = self._of.get(p)
        fits = kept is not None and kept[0] is layer and len(kept[1]) <= len(layer)
        have, counts = (kept[1], kept[2].copy()) if fits else (None, np.zeros(KEY_GROUPS, np.int64))
        done = 0 if have is None else len(have)
        parts = [] if have is None else [have]
        if len(layer) > done:
            # The keys appended since, read from the end (``reversed``): no step over the keys before.
            # Sliced as they are hashed: the slices of 10^7 keys made first and let go together
            # were 65-97 ms of ``list_dealloc`` in the writer (perf).
            added = _backwards(layer, len(layer) - done) if done else slices(layer)
            for part in added:
                parts.append(_group_array(np, part).astype(np.uint8))
                counts += np.bincount(parts[-1], minlength=KEY_GROUPS)
                time.sleep(LEAVE_PACE_S)
        out = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.uint8)
        self._of[p] = (layer, out, counts)
        return out, counts

    def forget_layer(self, layer: Any) -> None:
        """Keys are about to be popped from ``layer``: its groups no longer match its order."""
        for p in [p for p, kept in list(self._of.items()) if kept[0] is layer]:
            self._of.pop(p, None)

    def keep_only(self, panes: Any) -> None:
        """Forget the panes not in ``panes`` (dropped, or replaced whole)."""
        for p in [p for p in list(self._of) if p not in panes]:
            self._of.pop(p, None)

    def clear(self) -> None:
        self._of.clear()


def _backwards(layer: dict, n: int) -> Iterator[list]:
    """``layer``'s last ``n`` keys in its order, as lists of :data:`SLICE`: read from its end,
    the slices made first (n is the keys appended since the last checkpoint), then given oldest
    first, each let go once given."""
    made = list(slices(islice(reversed(layer), n)))     # newest slice first, each newest key first
    while made:
        yield made.pop()[::-1]


def indexable(layers: tuple) -> bool:
    """Whether a pane's layers can be read here: plain dicts, numpy importable."""
    return all(type(layer) is dict for layer in layers) and _numpy() is not None


def index_pane(p: Any, layers: tuple[dict, ...], oldest: OldestGroups) -> PaneIndex:
    """The index pass of pane ``p``'s ``layers`` (newest first, :func:`indexable`): O(keys of
    the layers over the oldest) of Python, O(keys appended to the oldest since the last) hashed."""
    np = _numpy()
    oldest_first = layers[::-1]
    first, counts = oldest.groups(p, oldest_first[0])
    groups = [first]
    present = counts > 0
    new: list = [None]
    count = len(oldest_first[0])
    for i in range(1, len(oldest_first)):
        layer, below = oldest_first[i], oldest_first[:i]
        only = below[0] if len(below) == 1 else None
        layer_groups, layer_new = [], []
        for part in slices(layer):
            layer_groups.append(_group_array(np, part).astype(np.uint8))
            present[layer_groups[-1]] = True
            layer_new.append(np.fromiter((not (k in only if only is not None else any(k in d for d in below))
                                          for k in part), bool, len(part)))
            time.sleep(LEAVE_PACE_S)
        groups.append(np.concatenate(layer_groups) if layer_groups else np.zeros(0, np.uint8))
        new.append(np.concatenate(layer_new) if layer_new else np.zeros(0, bool))
        count += int(new[-1].sum())
    return PaneIndex(oldest_first, groups, new, count, present)


def pick_groups(index: PaneIndex, wanted: frozenset[int] | None = None) -> dict[int, ChunkedEntries]:
    """The groups ``wanted`` (None: every one) of an indexed pane, each a :class:`ChunkedEntries`:
    its keys at their places in the merged order (a layer's new keys after every key under it),
    with their newest slots (a key of a later layer not new there replaces its slots, keeping
    the place an older layer gave it), as ``pane_layers.pane_groups`` makes them. A slice of
    keys at a time, sorted by group with numpy (a stable sort: each group's keys in their
    order), each group's share of it gathered and added in C: no step of Python per key."""
    np = _numpy()
    picked: dict[int, ChunkedEntries] = {}
    want = None
    if wanted is not None:
        want = np.zeros(KEY_GROUPS, bool)
        want[list(wanted)] = True
    pos = 0
    for layer, groups, new in zip(index.layers, index.groups, index.new):
        rank = None if new is None else np.cumsum(new) - 1      # a new key's place among the layer's new ones
        keys_of, values_of = iter(layer), iter(layer.values()) if want is None else None
        for a in range(0, len(groups), PICK_SLICE):
            # Every group: the slots read in order beside the keys. Some: looked up for their keys
            # only (a values' slice would touch every key's slots: a cache miss each).
            ks = list(islice(keys_of, PICK_SLICE))
            vs = list(islice(values_of, PICK_SLICE)) if values_of is not None else None
            gs = groups[a:a + PICK_SLICE]
            chosen = np.arange(len(ks)) if want is None else np.flatnonzero(want[gs])
            if len(chosen):
                order = chosen[np.argsort(gs[chosen], kind="stable")]
                ordered = gs[order]
                cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
                fresh = None if new is None else new[order + a]
                places = order + (a + pos) if new is None else rank[order + a] + pos
                for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(order)]):
                    g = int(ordered[lo])
                    into = picked.get(g)
                    if into is None:
                        into = picked[g] = ChunkedEntries()
                    at, to = order[lo:hi], places[lo:hi]
                    if fresh is not None and not fresh[lo:hi].all():
                        n = fresh[lo:hi]
                        into.replace(*_gathered(ks, vs, layer, at[~n]))
                        at, to = at[n], to[n]
                    into.append(*_gathered(ks, vs, layer, at), to)
            time.sleep(LEAVE_PACE_S)
        pos += len(groups) if new is None else (int(rank[-1]) + 1 if len(rank) else 0)
    return picked


def _gathered(keys: list, values: list | None, layer: dict, at: Any) -> tuple[list, list]:
    """The keys at positions ``at`` of a slice and their slots (``values``' beside them, or
    looked up in ``layer``), each a C call."""
    at = at.tolist()
    chosen = list(map(keys.__getitem__, at))
    return chosen, list(map(values.__getitem__, at)) if values is not None else list(map(layer.__getitem__, chosen))
