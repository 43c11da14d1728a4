"""Every hook a pescheduler plug-in can implement. This module is the plug-in contract.

A plug-in is a module (or object) with functions decorated by
``pescheduler.hookimpl`` and named like the specs below. It is found through
the ``pescheduler`` entry-point group::

    [project.entry-points.pescheduler]
    my-operators = "my_package.operators"

or named on the command line with ``--plugin my_package.operators``. The
built-in operators, policies and resource managers are registered through the
same entry-point group, so they prove the path a third-party package takes.

Hooks are grouped by the phase in which the runtime calls them. Each docstring
states the calling semantics: *collecting* hooks call every implementation and
gather the results; *first-result* hooks stop at the first non-None answer.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("pescheduler")


# -- Registration: called once when the plugin manager is built ---------------------

@hookspec
def pescheduler_operators():
    """Return the operator classes this plug-in provides (a list of ``Operator`` subclasses).

    Collecting: every implementation is called; the registry keys each class by
    its ``name`` attribute. Two plug-ins providing the same name is an error that
    names both origins.

    Example::

        @pescheduler.hookimpl
        def pescheduler_operators():
            return [Threshold]

    Sources and sinks among them take part in checkpoints through methods the
    runtime calls on each instance (``pescheduler.operator``; the operator
    guide, docs/operators.md, has the guarantee table):

    - ``Source.position()`` at a checkpoint barrier: a small value that survives
      JSON and msgpack unchanged (a dict with text keys); ``Source.seek(position)``
      on a fresh instance, before or after ``open``, reads on exactly after the
      last tuple returned before it. A partitioned source reports its own
      partitions; the union of its copies' positions seeks any instance. A
      source that cannot rewind raises ``pescheduler.errors.NotReplayable``
      (the default, unless the source overrides ``restore``).
    - ``Sink.pre_commit(id)`` at the barrier, before ``snapshot()``: stage what
      came before it (durable, not visible). ``Sink.commit(id)`` once checkpoint
      ``id`` is complete: publish what is staged under ``id`` and earlier ids;
      idempotent. A failed checkpoint gets no call (its output goes with the
      next commit). Recovery from checkpoint ``n``: ``restore(state)``, ``open``,
      ``commit(n)``, ``abort(n + 1)`` on a fresh instance: ``abort`` discards
      what was staged after ``n``. A sink that never sees ``pre_commit`` writes
      straight through (at-least-once through failures).
    """


@hookspec
def pescheduler_aggregates():
    """Return the window aggregate functions this plug-in provides (a list of ``Aggregate``).

    Collecting. An aggregate declares which other aggregates it is computed from
    (``avg`` uses ``sum`` and ``count``), so aggregates shared by several outputs
    or queries over one window are computed once.
    """


@hookspec
def pescheduler_resource_managers():
    """Return ``{name: ResourceManager class}`` for the resource managers this plug-in provides.

    Collecting. ``deploy --rm NAME`` selects one by name. The runtime builds the
    chosen class as ``cls(scheduler_address, settings)`` (``settings``: the
    ``pescheduler.rm.<name>`` config; on a TLS cluster also ``security=``, the
    deployment's ``distributed.Security``, for its own Client and the workers
    it starts) and uses the methods of
    ``pescheduler.resources.ResourceManager``, ``lendable()`` included.
    """


@hookspec
def pescheduler_config():
    """Return this plug-in's default settings: a mapping placed under ``pescheduler`` in dask.config.

    Collecting: every implementation is called when the plugin manager is
    built, and each mapping is added to the declared defaults beside
    ``pescheduler.yaml``, so the plug-in's knobs have one home (here), users
    override them where they override pescheduler's own (``--config FILE``,
    ``PESCHEDULER__...``), and a misspelt key is an error naming the closest
    one. A plug-in adds keys only: redeclaring a packaged key is an error
    naming the plug-in. Read the values without fallbacks, e.g. a policy's
    ``config["queue-batches"]``.

    Example::

        @pescheduler.hookimpl
        def pescheduler_config():
            return {"policies": {"latency-guard": {"queue-batches": 4}}}
    """


@hookspec
def pescheduler_policy_defaults():
    """Return this policy's settings with their defaults: a mapping placed under
    ``pescheduler.policies.<name>``, where ``<name>`` is the name the policy is
    registered by (its entry-point name, or the module given to ``--plugin``).

    Per plug-in: each policy's implementation is called when the plugin manager
    is built, and its mapping is declared as that policy's section, so the
    policy does not spell its own name (the installer's entry point chooses it),
    users set the keys where they set any other (``--config FILE``,
    ``PESCHEDULER__POLICIES__<NAME>__<KEY>``), a misspelt key is an error
    naming the closest one, and ``config`` in ``pescheduler_policy_decide``
    holds every key, read without fallbacks. A policy with no settings needs
    no implementation. (``pescheduler_config`` declares settings anywhere
    else under ``pescheduler``, e.g. an operator plug-in's.)

    Example::

        @pescheduler.hookimpl
        def pescheduler_policy_defaults():
            return {"busy": 0.9}        # a copy above 90% busy
    """


# -- Control loop: called by the controller every monitor interval -------------------

@hookspec
def pescheduler_policy_decide(snapshot, placement, resources, config):
    """Decide reconfiguration actions from the last monitor window.

    ``snapshot`` is an immutable ``MetricsSnapshot``, ``placement`` the current
    operators -> PEs -> workers -> hosts mapping, ``resources`` the resource
    manager's view, ``config`` this policy's settings (``pescheduler.policies.<name>``).
    Return a list of actions (``Fuse``, ``Split``, ``Replicate``, ``Release``,
    ``Move``, ``BorrowHosts``, ``ReturnHost``), each with a ``reason``.

    A policy decides and never touches the runtime. Only the policies selected
    for a deployment are called (each by its entry-point name); the controller
    calls them one at a time, merges their actions, applies and records them.
    A policy that raises or returns something else than a list of actions is
    quarantined, and the others go on (return ``[]`` for "nothing to do";
    ``None`` is quarantined too).

    ``config["history"]`` is a dict the controller keeps for this policy for
    the life of the deployment: keep state between windows there, not in
    module globals. Copies appear in ``placement`` as operators ``X#k`` with
    ``copy_of == "X"``; ``placement.slots`` are the standard slots.
    """
