"""Built-in policy plug-ins (installed as ``pescheduler.policies``).

A policy is a pure function from a metrics snapshot to a list of actions,
registered through the ``pescheduler`` entry-point group and implementing
``pescheduler_policy_decide`` (see ``pescheduler/hookspecs.py``). The built-in
``threshold``, ``rate`` and ``copy`` policies land here with the controller.
"""
