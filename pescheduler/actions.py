"""Actions: plain, frozen data that policies return and the runtime applies.

Each carries a ``reason`` (why it was decided) and ``figures`` (the numbers
behind it), so every decision can be recorded and explained. Policies never
touch the runtime; ``Deployment.apply`` (or the controller) does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class Hold:
    """Hysteresis a policy asks for: apply the action only once the policy has proposed it in
    ``rounds`` control rounds in a row and for ``seconds`` since it first did. The controller
    core counts (``control/controller.py``'s :class:`Hysteresis`), so policies stay stateless."""

    rounds: int = 1
    seconds: float = 0.0


@dataclass(frozen=True, repr=False)
class Action:
    reason: str = field(default="", kw_only=True)
    figures: Mapping[str, Any] = field(default_factory=dict, kw_only=True, compare=False)
    hold: Hold | None = field(default=None, kw_only=True, compare=False)

    def __repr__(self) -> str:
        """``Split('map-2->filter-3', ('filter-3',))``: the arguments that matter, in order (by
        keyword after one left out: ``Replicate('x', 1, hosts=('lab-1',))``)."""
        shown, skipped = [], False
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("reason", "figures", "hold") or value is None:
                skipped = skipped or f.name not in ("reason", "figures", "hold")
                continue
            shown.append(f"{f.name}={value!r}" if skipped else repr(value))
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def target(self) -> str:
        """What the action changes (cooldowns and conflict resolution key on it)."""
        raise NotImplementedError


@dataclass(frozen=True, repr=False)
class Fuse(Action):
    """Run every operator of ``pe_a`` and ``pe_b`` in one PE (on ``pe_a``'s worker)."""

    pe_a: str
    pe_b: str

    @property
    def target(self) -> str:
        return self.pe_a


@dataclass(frozen=True, repr=False)
class Split(Action):
    """Move ``operators`` out of ``pe`` into a new PE on ``worker`` (default: the least loaded)."""

    pe: str
    operators: tuple[str, ...]
    worker: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "operators", tuple(self.operators))

    @property
    def target(self) -> str:
        return self.pe


@dataclass(frozen=True, repr=False)
class Move(Action):
    """Run ``pe`` on ``worker`` instead."""

    pe: str
    worker: str

    @property
    def target(self) -> str:
        return self.pe


@dataclass(frozen=True, repr=False)
class Replicate(Action):
    """Add ``copies`` copies of ``operator`` on standard slots (``X#1``, ``X#2``, ...).

    ``routers``: the upstream operators that send to the new copies. ``None``
    (the default) shares each copy among every router feeding ``operator``
    (weight 1 each, like the original); naming one router makes the copies
    *exclusive* to it (weight N, N being the number of routers), as in the
    Fujitsu standard-thread method. KEYED operators' copies are always shared:
    every router must agree on who owns a key group.

    ``hosts``: the copies land only on standard slots of these hosts (``None``:
    any). The controller fills it in to steer copies off hosts with no CPU to spare.
    """

    operator: str
    copies: int = 1
    routers: tuple[str, ...] | None = None
    hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("routers", "hosts"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def target(self) -> str:
        return self.operator


@dataclass(frozen=True, repr=False)
class Release(Action):
    """Remove the newest ``copies`` copies of ``operator``; their partials are flushed downstream.

    ``routers``: only these routers stop using the copies; a copy is removed
    when no router uses it any more (reference counting). ``None``: every router.
    """

    operator: str
    copies: int = 1
    routers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.routers is not None:
            object.__setattr__(self, "routers", tuple(self.routers))

    @property
    def target(self) -> str:
        return self.operator


@dataclass(frozen=True, repr=False)
class BorrowHosts(Action):
    """Ask the resource manager for ``n`` more hosts."""

    n: int = 1

    @property
    def target(self) -> str:
        return "hosts"


@dataclass(frozen=True, repr=False)
class ReturnHost(Action):
    """Give ``host`` back to the resource manager (its PEs are moved off first)."""

    host: str

    @property
    def target(self) -> str:
        return self.host


class ActionRefused(ValueError):
    """An action that cannot be applied; the message is the reason. The stream is not disturbed."""
