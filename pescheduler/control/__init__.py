"""The control plane, in the deploying process: one object of each kind per deployment.

It reads the plan (:mod:`pescheduler.plan`), drives the workers
(:mod:`pescheduler.worker`) over Dask RPC, runs the policies and talks to the
resource manager. Nothing here runs on a worker. Where things are:

* ``deployment.py``: :class:`Deployment`, the synchronous facade users hold, and ``deploy``;
* ``gateway.py``: every call to PE hosts and the scheduler, typed (:class:`WorkerGateway`);
* ``reconfigurer.py``: **where an action is applied** (``Reconfigurer.apply``), the only
  writer of the placement, channels and epoch; its ``lock`` is the one the checkpoint
  coordinator (``checkpoint/coordinator.py``) triggers barriers under, so checkpoints and
  reconfigurations never interleave;
* ``protocol.py``: the protocol one reconfiguration runs (pause at a marker, drain,
  snapshot, rewire, restore, resume);
* ``control_loop.py``: collect → snapshot → policies → merge → apply → record;
  ``controller.py`` its decision core (hysteresis, merge, cooldown, validation),
  ``isolation.py`` the policies' deadlines;
* ``state.py``: the deployment's and PEs' state machine; ``status.py`` its view;
  ``monitor.py`` snapshots; ``deadletters.py`` dead letters kept, counted, judged,
  ``failures.py`` one made readable (exception, the app's line, a sample);
* ``hosts.py``: borrowed hosts (through the small ``Fleet`` protocol; the resource managers'
  contract is ``pescheduler/resources.py``);
* ``recovery.py``: a lost worker, host or PE restores the last complete checkpoint;
* ``cluster.py``: the embedded cluster; ``statefile.py``: where ``status``/``stop`` find it;
  ``claims.py``: one running deployment per name and per output path.

Every knob's default is in ``pescheduler/pescheduler.yaml``, one comment each.
"""
