"""From a placement to what workers run: PE specs and the channels between PEs.

Used for the first launch and for every reconfiguration, so a PE built after
a fuse or split is wired exactly like one built at deploy time.
"""

from __future__ import annotations

from .. import config
from ..operator import Parallelism
from .placement import Placement
from .routing import router_targets
from ..wire import InputSpec, OutputSpec, PESpec
from .transforms import routers_of

ChannelKey = tuple[str, str, str]          # (producing op, port, consuming PE)


def channel_ids(placement: Placement, deployment: str, epoch: int,
                keep: dict[ChannelKey, str] | None = None) -> dict[ChannelKey, str]:
    """An id per channel the placement needs; ``keep`` maps channels that survive to their ids."""
    keep = keep or {}
    ids = {}
    for src, port, _dst, dst_pe in placement.channels():
        key = (src, port, dst_pe)
        ids[key] = keep.get(key) or f"{deployment}/{epoch}/{src}.{port}->{dst_pe}"
    return ids


def output_spec(placement: Placement, worker_info: dict[str, dict], key: ChannelKey, channel_id: str) -> OutputSpec:
    src, port, dst_pe = key
    worker = placement.pes[dst_pe].worker
    inside = set(placement.pes[dst_pe].operators)
    consumers = tuple(d for s, p, d in placement.plan.edges if (s, p) == (src, port) and d in inside)
    return OutputSpec(channel_id, src, port, dst_pe, worker, worker_info[worker]["data_address"], consumers)


def routing_for(placement: Placement, pe_id: str) -> dict[tuple[str, str, str], tuple]:
    """The routers of ``pe_id``'s operators: ``(src, port, X) -> (RouterTargets, key field)``
    for every copied operator ``X`` they feed."""
    plan = placement.plan
    routing = {}
    for op_id in placement.pes[pe_id].operators:
        for src, port, dst in plan.edges:
            x = placement.original(dst)
            if src != op_id or x not in placement.routes or placement.copies.get(src) == x:
                continue
            routers = routers_of(placement, x)
            targets = router_targets(x, placement.copies_of(x), placement.routes[x], src, routers,
                                     stateless=plan.ops[x].parallelism is Parallelism.STATELESS)
            routing[(src, port, x)] = (targets, plan.ops[x].key_field)
    return routing


def consumer_edges(placement: Placement, pe_id: str) -> list[tuple[str, str, str]]:
    """The edges whose consumer runs in ``pe_id``."""
    members = set(placement.pes[pe_id].operators)
    return [(s, p, d) for s, p, d in placement.plan.edges if d in members]


def copy_map(placement: Placement) -> dict[str, str]:
    """Copy operator -> its original, over the whole plan (a plain dict: it goes over the wire)."""
    return dict(placement.copies)


def build_specs(placement: Placement, worker_info: dict[str, dict], deployment: str,
                channels: dict[ChannelKey, str], pe_ids=None, epoch: int = 0) -> dict[str, PESpec]:
    """A :class:`PESpec` for each PE (or those in ``pe_ids``): operators, edges, channels;
    ``epoch``: the Reconfigurer's epoch creating them (checkpoint barriers of older ones are stale)."""
    plan = placement.plan
    wanted = set(placement.pes if pe_ids is None else pe_ids)
    batch_size = int(config.get("batch.size"))
    credits = int(config.get("channel.credits"))
    hold = int(config.get("state.hold"))
    time_slice = float(config.get("pe.time-slice-ms")) / 1000
    specs = {}
    for pe_id in wanted:
        pe = placement.pes[pe_id]
        ops = {op: (plan.ops[op].cls, dict(plan.ops[op].params), plan.ops[op].key_field) for op in pe.operators}
        specs[pe_id] = PESpec(pe_id, deployment, ops, consumer_edges(placement, pe_id), batch_size=batch_size,
                              latency_s=placement.latency_s, credits=credits, hold=hold, time_slice_s=time_slice,
                              routing=routing_for(placement, pe_id), copies=copy_map(placement), epoch=epoch)
    for key, channel_id in channels.items():
        src, port, dst_pe = key
        src_pe = placement.pe_of(src)
        if src_pe in specs:
            specs[src_pe].outputs.append(output_spec(placement, worker_info, key, channel_id))
        if dst_pe in specs:
            specs[dst_pe].inputs.append(InputSpec(channel_id, src, port))
    return specs
