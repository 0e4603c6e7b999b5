"""Dask on a resizable job (the ``dask`` extra; docs/frameworks.md, "Dask").

In task 0::

    from distributed import Client
    from xce_resize_plugin.integrations.dask import XCECluster

    with XCECluster() as cluster, Client(cluster) as client:
        cluster.adapt(minimum=1, maximum=7)   # or cluster.scale(4)
        ...

and in every other task the command ``xce-dask-worker``; ``xce-dask-retire`` as the
job's notification command retires the workers an outside release takes before they
are stopped.
"""

from xce_resize_plugin.integrations.dask.cluster import (
    RETIRE_STIMULUS,
    SCHEDULER_KEY,
    XCEAdaptive,
    XCECluster,
)

__all__ = ["RETIRE_STIMULUS", "SCHEDULER_KEY", "XCEAdaptive", "XCECluster"]
