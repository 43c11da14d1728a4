"""What runs where, as data: the app graph, the compiler, plans, placement transforms, routing.

Nothing here talks to a cluster. The deploying process compiles an
:class:`~pescheduler.plan.app.Application` into a placement
(:mod:`.compiler`), and every change to it is a pure function of the
placement (:mod:`.transforms`); :mod:`.wiring` turns a placement into the
wire specs the workers run.
"""
