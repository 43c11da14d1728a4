"""One running deployment per name and per output path.

A second deployment of a running name hid the first from ``list`` and ``stop``;
two writing the same file truncated and interleaved each other's rows. Both
are refused before anything starts, naming the running one. The records
compared are ``statefile`` records (embedded deployments on this machine) and
the statuses deployments publish on a cluster; both carry ``name``, ``app``
and ``outputs``.

The comparison and the claim are one step, so two deploys started at once cannot
both pass: on this machine under a lock on the state directory
(``statefile.locked``), on a cluster under a Dask ``Lock`` held in its scheduler
while the newcomer publishes itself as ``starting`` (:func:`claim_on_cluster`).
"""

from __future__ import annotations

from distributed import Lock

from ..errors import DeploymentClash
from ..plan.outputs import overlapping

RUNNING = ("starting", "running", "stopping")
CLUSTER_LOCK = "pescheduler-claims"       # the scheduler's lock around compare-and-publish
PUBLISHED = ("pescheduler", "deployments")  # the metadata where deployments publish their status


def with_lost(published: dict, clients) -> dict:
    """The cluster's ``published`` statuses with those whose deploying process has left its
    scheduler marked ``lost``: a running status is rewritten by its deploying process only, so
    one SIGKILLed stays ``running`` in the metadata for good and would hold its name and paths.
    ``clients``: the ids of the clients connected to the scheduler now (:func:`connected_clients`);
    a status published without its client's id (an older deployment) is taken as it says."""
    marked = {}
    for dep_id, status in (published or {}).items():
        if status.get("state") in RUNNING and status.get("client") and status["client"] not in clients:
            status = {**status, "state": "lost",
                      "error": f"its deploying process (client {status['client']}) has left the scheduler"}
        marked[dep_id] = status
    return marked


def _client_ids(dask_scheduler) -> list[str]:
    return list(dask_scheduler.clients)


def connected_clients(client):
    """The ids of the clients connected to ``client``'s scheduler (a list; awaitable when
    ``client`` is asynchronous), for :func:`with_lost`."""
    return client.run_on_scheduler(_client_ids)


async def claim_on_cluster(client, status: dict, unique_name: bool) -> str:
    """Refuse a clash with a deployment running or starting on ``client``'s cluster (a name not
    ``unique_name`` gets a free suffix instead), then publish the newcomer's ``status``
    (``starting``: id, name, app, outputs), holding the cluster's lock throughout; its name."""
    async with Lock(CLUSTER_LOCK, scheduler_rpc=client.scheduler, loop=client.loop):
        running = running_published(with_lost(await client.get_metadata(list(PUBLISHED), default=None),
                                               set(await connected_clients(client))))
        if unique_name:
            refuse_same_name(status["name"], running, f"on {client.scheduler.address}")
        name = free_name(status["name"], {s["name"] for s in running})
        refuse_same_outputs(name, status["outputs"], running)
        await client.set_metadata([*PUBLISHED, status["id"]], {**status, "name": name})
        return name


async def withdraw_on_cluster(client, status: dict) -> None:
    """A start that failed after :func:`claim_on_cluster` publishes its final ``status``: no longer ``starting``."""
    await client.set_metadata([*PUBLISHED, status["id"]], status)


def refuse_same_outputs(name: str, outputs: list[str], running: list[dict]) -> None:
    """DeploymentClash when a running deployment writes one of ``outputs`` (or a path inside it)."""
    for other in running:
        shared = overlapping(outputs, list(other.get("outputs") or ()))
        if shared:
            raise DeploymentClash(
                f"{name!r} would write {shared[0]}, which the running deployment {_called(other)} writes; "
                f"two deployments writing one file truncate and mix each other's rows. Give this one "
                f"another path, or stop the other first (`python -m pescheduler stop {other.get('name')}`)")


def refuse_same_name(name: str, running: list[dict], where: str) -> None:
    """DeploymentClash when a deployment called ``name`` runs (``where``: this machine, a cluster)."""
    for other in running:
        if name == other.get("name"):
            raise DeploymentClash(
                f"a deployment named {name!r} is already running {where} ({_called(other)}); stop it "
                f"first (`python -m pescheduler stop {name}`) or give this one another --name")


def free_name(name: str, taken: set[str]) -> str:
    """``name``, else ``name-2``, ``name-3``...: the first not in ``taken``."""
    n, chosen = 1, name
    while chosen in taken:
        n += 1
        chosen = f"{name}-{n}"
    return chosen


def running_published(published: dict) -> list[dict]:
    """The running ones of a cluster's published statuses (``pescheduler/deployments`` metadata);
    one published before deployments had names is called by its app."""
    return [{**s, "name": s.get("name") or s.get("app")} for s in (published or {}).values()
            if s.get("state") in RUNNING]


def _called(other: dict) -> str:
    app, name = other.get("app", "?"), other.get("name") or other.get("id", "?")
    pid = f", pid {other['pid']}" if other.get("pid") else ""
    return f"{name!r} of app {app!r}{pid}" if name != app else f"{name!r}{pid}"
