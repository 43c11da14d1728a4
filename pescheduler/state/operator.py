"""``KeyedOperator``: a KEYED operator whose state is the keyed states it names, nothing else to write.

An operator of your own that keeps its state in ``pescheduler.state`` would
otherwise write six methods the built-ins write (``snapshot``, ``restore``,
``split_state``, ``merge_states``, and ``export_groups``/``import_groups`` for a
rescale that moves only the key groups changing owner) and adopt its stores at
``open``. Without the last two, a Replicate or Release took the whole state
apart in the PE's turn (``worker/handover.py``): a pause that grew with it.
Here they come from one declaration, as a Flink operator declares its state
descriptors and the runtime snapshots and redistributes them::

    class RunningCount(KeyedOperator):
        name = "running_count"
        keyed_states = ("counts",)      # attributes holding a KeyedState each

        def process(self, batch, emit):
            ...self.counts.get(key, 0)... self.counts.put(key, n)

Each named attribute is a :class:`~pescheduler.state.MemoryState` from the
instance's creation (``restore`` comes before ``open``), the deployment's
backend from ``open`` on (a disk store of its own each, with its own
``pescheduler.state.cache``). The snapshot is ``{name: key groups}``, each a
view packed only when read, so a checkpoint writes it incrementally off the PE's
loop as it writes the built-ins'. State besides the keyed states (a watermark,
tuples waiting) is the subclass's: it extends these methods, calling ``super()``.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from ..operator import Operator, OperatorContext, Parallelism
from .base import KeyedState
from .groups import add_groups, merge_groups, restore_groups, snapshot_groups, split_groups, take_groups
from .memory import MemoryState
from .settings import adopt


class KeyedOperator(Operator):
    """A KEYED operator whose state is the :class:`KeyedState` attributes named in
    :attr:`keyed_states`; see the module docstring."""

    parallelism = Parallelism.KEYED
    keyed_states: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, *args: Any, **kwargs: Any):
        names = cls.keyed_states
        if (not isinstance(names, tuple) or not names or not all(isinstance(n, str) and n.isidentifier() for n in names)
                or len(set(names)) != len(names)):
            raise TypeError(f"{cls.__name__}.keyed_states must be a tuple of distinct attribute names, "
                            f"such as ('counts',); got {names!r}")
        if cls.parallelism is not Parallelism.KEYED:
            raise TypeError(f"{cls.__name__}: a KeyedOperator is KEYED (its state is split by key group); "
                            f"got parallelism {cls.parallelism!r}")
        self = super().__new__(cls, *args, **kwargs)
        for name in names:                          # before __init__: restore() may come before open()
            setattr(self, name, MemoryState())
        return self

    def _states(self) -> dict[str, KeyedState]:
        states = {name: getattr(self, name, None) for name in self.keyed_states}
        wrong = {n: type(s).__name__ for n, s in states.items() if not isinstance(s, KeyedState)}
        if wrong:
            raise TypeError(f"{type(self).__name__}: keyed_states names attributes that must hold a KeyedState "
                            f"(left as created, or pescheduler.state.MemoryState()); "
                            + ", ".join(f"{n} is a {t}" for n, t in wrong.items()))
        return states

    def open(self, context: OperatorContext) -> None:
        """Each keyed state moved into the deployment's backend (what ``restore`` put in it kept)."""
        super().open(context)
        for name, state in self._states().items():
            setattr(self, name, adopt(context, state, name))

    # -- checkpoints: each state's key groups, a view written incrementally ---------------------
    def snapshot(self) -> dict:
        return {name: snapshot_groups(state) for name, state in self._states().items()}

    def restore(self, state: dict) -> None:
        states = self._states()
        missing = [name for name in states if name not in state]
        if missing:
            raise ValueError(f"{type(self).__name__}: the state restored holds no keyed state named "
                             f"{', '.join(map(repr, missing))} (it holds {', '.join(map(repr, state))}): "
                             f"was it taken by an operator with other keyed_states?")
        for name, held in states.items():
            restore_groups(held, state[name])

    # -- rescales: whole key groups, never the rest (pescheduler/worker/handover.py) ------------
    def export_groups(self, groups: frozenset[int]) -> dict:
        """Key groups ``groups`` of every keyed state taken away, packed only when the part is pickled."""
        return {name: take_groups(held, groups) for name, held in self._states().items()}

    def import_groups(self, state: dict) -> None:
        """Key groups another instance exported join this running one."""
        for name, held in self._states().items():
            add_groups(held, state[name])

    def split_state(self, state: dict, owns: Callable[[Any], bool]) -> dict:
        return {**state, **{name: split_groups(state[name], owns) for name in self.keyed_states}}

    def merge_states(self, states: list) -> dict:
        return {**states[0], **{name: merge_groups([s[name] for s in states]) for name in self.keyed_states}}
