"""The built-in resource managers, registered like any plug-in (``builtin-resource-managers``).

* ``local`` (:mod:`.local`): hosts are groups of local Dask worker processes
  within a budget; an optional demand schedule asks for them back.
* ``lab`` (:mod:`.lab`): hosts are network namespaces with a cgroup CPU quota
  each, a ``dask worker`` inside; needs root.
* ``spark`` (:mod:`.spark`): hosts are executors of a PySpark application with
  dynamic allocation, each running a Dask worker inside a long Spark task.
  Importing it does not import pyspark; starting it does.
"""

from __future__ import annotations

from pescheduler.plugins import hookimpl

from .lab import LabResourceManager
from .local import LocalResourceManager
from .spark import SparkResourceManager


@hookimpl
def pescheduler_resource_managers():
    """``local``, ``lab`` and ``spark``."""
    return {"local": LocalResourceManager, "lab": LabResourceManager, "spark": SparkResourceManager}
