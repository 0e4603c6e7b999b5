"""Dask on a resizable job (the ``dask`` extra; docs/frameworks.md, "Dask").

In task 0::

    from distributed import Client
    from xce_resize_plugin.integrations.dask import XCECluster

    with XCECluster() as cluster, Client(cluster) as client:
        cluster.adapt(minimum=1, maximum=7)   # or cluster.scale(4)
        ...

and in every other task the command ``xce-dask-worker``. A release from outside the
job reaches the cluster and its workers as a ``release_coming`` job event: they retire
the workers it takes and acknowledge it. ``xce-dask-retire``, as the job's notification
command, does the retiring where no such event comes (a release without a drain time,
a controller without job events).
"""

from xce_resize_plugin.integrations.dask.cluster import (
    RETIRE_STIMULUS,
    SCHEDULER_KEY,
    XCEAdaptive,
    XCECluster,
)

__all__ = ["RETIRE_STIMULUS", "SCHEDULER_KEY", "XCEAdaptive", "XCECluster"]
