"""``latency-guard``: copy the operator whose input queue is longest; release once queues stay empty.

Tuples waiting in a queue are latency. Each monitor window this policy finds
the PE with the most input batches waiting (at least ``queue-batches``),
and asks for one copy of its busiest operator that may be copied. Once that
operator's queues have been empty for ``calm-windows`` windows in a row,
its copies go.

Settings (``pescheduler.policies.latency-guard.*`` in dask.config, named after
the entry point pyproject.toml registers; nothing needs setting): declared, with their defaults, by ``pescheduler_policy_defaults``
below, so a misspelt key is an error and the values are read without fallbacks.
"""

from __future__ import annotations

from pescheduler import Parallelism, Release, Replicate, hookimpl

_HISTORY: dict = {}          # used when no controller passes config["history"] (a notebook)


@hookimpl
def pescheduler_policy_defaults():
    return {
        "queue-batches": 4,     # a PE with this many input batches waiting gets a copy of its busiest operator
        "calm-windows": 5,      # windows in a row with empty queues before the copies go
        "max-copies": 2,        # copies of one operator at most
    }


@hookimpl
def pescheduler_policy_decide(snapshot, placement, resources, config):
    memory = config.get("history", _HISTORY)
    guarded = memory.setdefault("guarded", {})          # operator -> calm windows in a row
    actions = []
    for op, calm in list(guarded.items()):
        waiting = sum(snapshot.pes[p].queue_batches for p in _pes_of(placement, op) if p in snapshot.pes)
        guarded[op] = calm + 1 if waiting == 0 else 0
        copies = placement.copies_of(op)
        if guarded[op] >= config["calm-windows"] and copies:
            del guarded[op]
            actions.append(Release(op, len(copies), reason=f"no tuple has waited for {op} for "
                                                           f"{config['calm-windows']} windows"))
    longest = max(snapshot.pes.values(), key=lambda m: (m.queue_batches, m.pe), default=None)
    if longest is None or longest.queue_batches < config["queue-batches"]:
        return actions
    op = _busiest_copyable(snapshot, placement, longest.operators)
    if op and op not in {a.operator for a in actions} and len(placement.copies_of(op)) < config["max-copies"]:
        guarded[op] = 0
        actions.append(Replicate(op, 1, figures={"queue_batches": longest.queue_batches, "pe": longest.pe},
                                 reason=f"PE {longest.pe} has the longest input queue "
                                        f"({longest.queue_batches} batches): copy {op}"))
    return actions


def _pes_of(placement, op):
    return {placement.pe_of(i) for i in placement.instances(op)}


def _busiest_copyable(snapshot, placement, operators):
    """The busiest operator that has an upstream (not a source) and is not SINGLETON."""
    ops = placement.plan.ops
    fit = [o for o in operators if ops[o].copy_of is None and ops[o].parallelism is not Parallelism.SINGLETON
           and placement.plan.upstream(o)]
    return max(fit, key=lambda o: snapshot.operators[o].busy if o in snapshot.operators else 0.0, default=None)
