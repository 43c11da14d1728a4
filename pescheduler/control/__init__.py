"""The control plane, in the deploying process: deployment, reconfiguration, control loop, hosts, monitor, status.

It reads the plan (:mod:`pescheduler.plan`), drives the workers
(:mod:`pescheduler.worker`) over Dask RPC, runs the policies and talks to the
resource manager. Nothing here runs on a worker.
"""
