"""Site policy: jobs may only be resized to a power-of-two number of tasks.

Why a site wants it: many FFT and multigrid codes decompose their domain by halving and
cannot use 6 or 12 ranks. A grow must ask for an exact count (``bresize request 4``,
not ``2,4``), because a partial grant could land on any size in between; a release must
leave a power of two. A target (``xce-resize target``) and autoresize cannot be set:
their grows take what is free, any size in between (a job at 4 tasks with a target of
8 and 2 free slots would run at 6). A job submitted autoresizable (``bsub -ar``) is the
host's submission to refuse: this hook is not asked then.

Enable with ``[resize] policy_files = ["hooks/power_of_two.py"]``.
"""

from __future__ import annotations

from xce_resize_plugin import (
    AutoresizeRequest,
    GrowRequest,
    JobInfo,
    PolicyRejected,
    ReleaseRequest,
    ResizeRequest,
    TargetRequest,
    hookimpl,
    release_size,
)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@hookimpl
def xce_resize_validate(job: JobInfo, request: ResizeRequest) -> None:
    current = len(job.tasks)
    if isinstance(request, GrowRequest):
        if request.min_add != request.max_add:
            raise PolicyRejected("this site allows only exact grows (bresize request N)")
        after = current + request.max_add
    elif isinstance(request, ReleaseRequest):
        after = current - release_size(request, job.tasks)
    elif isinstance(request, TargetRequest) and request.tasks is not None:
        raise PolicyRejected("this site does not allow targets (their grows take any count)")
    elif isinstance(request, AutoresizeRequest) and request.enabled:
        raise PolicyRejected("this site does not allow autoresize (it grows by any count)")
    else:
        return
    if not _power_of_two(after):
        raise PolicyRejected(f"job sizes must be powers of two: {current} -> {after} tasks")
