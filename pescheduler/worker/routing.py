"""The router: splits one port's batches among the instances of one consumer (runtime, per PE).

How the instances share their input is the planner's (``plan/routing.py``:
distribution lists, weights, key groups); this module is only what runs it on
the worker, from the :class:`~pescheduler.wire.RouterTargets` a PE's spec
carries: weighted turns, by credit for a STATELESS consumer, by key group for
a KEYED one.
"""

from __future__ import annotations

from typing import Any, Callable

from ..wire import KEY_GROUPS, RouterTargets, key_group

_HELD_ROOM = -(1 << 40)          # a held channel's room: below any channel's backlog


def _room(channel: Any) -> int:
    """Batches ``channel`` takes before its sender waits: its credit minus the data it buffers
    (``None``: an operator in the router's own PE, room 0)."""
    if channel is None:
        return 0
    if channel.holding:
        return _HELD_ROOM
    return channel.gate.credits - channel.data_pending()


def key_function(key_field: str | Callable | None) -> Callable[[Any], Any]:
    """How a tuple's key is read: a field name or a callable (as ``key_by`` gives it)."""
    if key_field is None:
        raise ValueError("a KEYED operator needs a key (a key_by before it, or key=) to be copied")
    if callable(key_field):
        return key_field
    return lambda t, f=key_field: t[f]


class Router:
    """Splits one port's batches among the instances of one consumer (runtime, per PE).

    ``targets[i]`` receives the part for instance ``i`` (a channel's ``send``
    or a fused operator's push). Weighted routing sends whole batches (smooth
    weighted round robin); routing by credit sends whole batches to the
    instance with the most room (``channels[i]``: the channel ``targets[i]``
    sends on, None for an operator in this PE); keyed routing splits a batch by
    key group. Counts per instance are kept for the monitor and the tests.
    """

    __slots__ = ("instances", "targets", "weights", "_current", "_total", "owner_index", "key",
                 "tuples", "field", "_owner_of", "channels", "_next")

    def __init__(self, spec: RouterTargets, targets: list[Callable[[list], None]],
                 key_field: str | Callable | None = None, channels: list | None = None) -> None:
        self.instances = spec.instances
        self.targets = targets
        self.channels = channels if spec.by_credit and channels is not None and not spec.owners else None
        self._next = 0                      # by credit: where the search for the most room starts
        self.weights = list(spec.weights) or [1] * len(targets)
        self._current = [0] * len(targets)
        self._total = sum(self.weights)
        self.tuples = [0] * len(targets)
        self.owner_index: list[int] | None = None
        self.key = None
        self.field = key_field if isinstance(key_field, str) else None    # Arrow batches split by column
        self._owner_of: dict = {}           # key -> instance index, for Arrow batches
        if spec.owners:
            index = {inst: i for i, inst in enumerate(spec.instances)}
            self.owner_index = [index[o] for o in spec.owners]
            self.key = key_function(key_field)

    def send(self, batch: list) -> None:
        if self.owner_index is None:
            i = self._pick() if self.channels is None else self._most_room()
            self.tuples[i] += len(batch)
            self.targets[i](batch)
            return
        # Hot path for KEYED copies: one key read and one hash per tuple.
        if not isinstance(batch, list):
            if self._send_columns(batch):
                return
            batch = batch.to_pylist()       # an Arrow batch keyed by a callable, or with nulls: as rows
        parts: list[list] = [[] for _ in self.targets]
        owner, key, groups = self.owner_index, self.key, KEY_GROUPS
        for t in batch:
            parts[owner[key_group(key(t), groups)]].append(t)
        for i, part in enumerate(parts):
            if part:
                self.tuples[i] += len(part)
                self.targets[i](part)

    def _send_columns(self, batch: Any) -> bool:
        """Split an Arrow batch by key group and stay columnar: one hash per distinct key (the
        key column dictionary-encoded), then a numpy mask and ``RecordBatch.filter`` per instance.
        Issue 16: splitting rows (``to_pylist``) made a copied columnar window ~50x slower and
        its key groups went the row path. False when the key is not one plain column."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        i = batch.schema.get_field_index(self.field) if self.field is not None else -1
        if i < 0 or batch.column(i).null_count:
            return False
        column = batch.column(i)
        encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
        owner_of, owner, groups = self._owner_of, self.owner_index, KEY_GROUPS
        per_value = np.fromiter((owner_of[k] if k in owner_of else
                                 owner_of.setdefault(k, owner[key_group(k, groups)])
                                 for k in encoded.dictionary.to_pylist()),
                                dtype=np.int32, count=len(encoded.dictionary))
        instance = per_value[encoded.indices.to_numpy(zero_copy_only=False)]
        for n, target in enumerate(self.targets):
            mask = instance == n
            rows = int(mask.sum())
            if rows:
                self.tuples[n] += rows
                target(batch if rows == len(batch) else batch.filter(pa.array(mask)))
        return True

    def _most_room(self) -> int:
        """The weighted turn's instance if it has room (or runs in this PE); else the instance
        with the most room: credit minus data its channel buffers; an operator in
        this PE has room 0 (it runs the batch here, at this PE's pace: instances with credit to
        spare go first, and it takes what none of them can); a held channel (a reconfiguration
        waits for its rewire) comes last. Ties go in turn, from the one after the last pick."""
        channels = self.channels
        i = self._pick()
        if channels[i] is None or _room(channels[i]) > 0:
            return i
        n = len(channels)
        best, best_room = 0, None
        for k in range(n):
            i = (self._next + k) % n
            room = _room(channels[i])
            if best_room is None or room > best_room:
                best, best_room = i, room
        self._next = (best + 1) % n
        return best

    def room_besides(self, channel: Any, full: Callable[[Any], bool]) -> bool | None:
        """Does an instance other than the one ``channel`` reaches still take batches: an operator
        in this PE, or a channel that is neither held (nor about to be) nor ``full``? None when ``channel`` is not one
        of this router's (worker/flow.py: a STATELESS operator's output is full only when every
        instance's is)."""
        if self.channels is None or not any(c is channel for c in self.channels):
            return None
        return any(c is None or (c is not channel and not c.holding and not full(c)) for c in self.channels)

    def _pick(self) -> int:
        """Smooth weighted round robin (nginx): even spacing, exact shares over a cycle."""
        current, weights = self._current, self.weights
        best = 0
        for i, w in enumerate(weights):
            current[i] += w
            if current[i] > current[best]:
                best = i
        current[best] -= self._total
        return best
