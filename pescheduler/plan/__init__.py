"""What runs where, as data: the app graph, the compiler, plans, placement transforms, routing.

Nothing here talks to a cluster. The deploying process compiles an
:class:`~pescheduler.plan.app.Application` through typed phases into a
logical plan and then a physical plan, ``Placement`` (:mod:`.compiler`,
:mod:`.placement`); every change to it is a pure function of the placement
(:mod:`.transforms`, where :func:`~.transforms.can_fuse` is the one fusion
rule); :mod:`.state` deals operator state over a changed placement;
:mod:`.wiring` turns a placement into the wire specs (``pescheduler.wire``)
the workers run.
"""
