"""Facts: what happened to one job's resize, each written to the journal before anyone
acts on it.

The engine decides facts (:mod:`.engine`); :func:`.fold.evolve` folds each into the job's
:class:`~.models.ResizeState`, and replaying a job's facts from the start gives the
materialised state exactly (tested). :data:`Fact` is their union and :data:`FACT_TYPES`
their classes; the journal's encoding of them is in :mod:`.converters`. Frozen attrs
classes, no serialisation code, like :mod:`.models`.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from xce_resize_plugin.core.models import Target, Task


@frozen
class JobTracked:
    """The plugin starts keeping state for a running job (at its first resize)."""

    job_id: str
    at: float
    user: str
    min_tasks: int
    max_tasks: int
    tasks: Sequence[Task]
    started_at: float


@frozen
class GrowRequested:
    job_id: str
    at: float
    min_add: int
    max_add: int
    notify_cmd: str | None
    principal: str
    #: The autoresize demand, decided by the plugin (``principal`` is ``autoresize``).
    auto: bool = False
    #: ``wait_ready``: the seconds the new tasks get to be ready (``None``: no wait).
    ready_timeout: float | None = None


@frozen
class AutoresizeSet:
    """Autoresize turned on or off. ``reason``: submit (the job started with it),
    modify, request (a manual request with ``-c`` replaced the demand), cancel,
    given-up (the demand's grow failed ``notify_max_failures`` times in a row).
    ``notify_cmd`` is the job's notification command, which the demand's grows run."""

    job_id: str
    at: float
    enabled: bool
    notify_cmd: str | None
    principal: str
    reason: str


@frozen
class TargetSet:
    """The job's target size set (``target``) or cleared (``None``). ``reason``: set,
    clear, request / release / cancel (a manual change took over), autoresize (turned
    on), given-up (the target's grow failed ``notify_max_failures`` times in a row)."""

    job_id: str
    at: float
    target: Target | None
    principal: str
    reason: str


@frozen
class GrowCancelled:
    """The pending grow is gone. ``reason``: cancel, replaced, job-ended."""

    job_id: str
    at: float
    reason: str


@frozen
class GrowPlaced:
    """Slots for a pending grow are reserved: charged from this fact on."""

    job_id: str
    at: float
    tasks: tuple[Task, ...]


@frozen
class ReleaseAccepted:
    job_id: str
    at: float
    tasks: Sequence[Task]
    notify_cmd: str | None
    principal: str
    cancelled_pending: bool = False
    #: Seconds the tasks drain between the notification and the stop (0: no drain).
    grace: float = 0.0


@frozen
class NotifyStarted:
    job_id: str
    at: float
    attempt: int


@frozen
class NotifyDone:
    """The notification command finished. ``gave_up``: a failed grow is cancelled."""

    job_id: str
    at: float
    attempt: int
    ok: bool
    status: int | None
    reason: str = ""
    gave_up: bool = False


@frozen
class TasksLaunched:
    """The launch of a grow's tasks (or the stop of a shrink's) was handed to the host."""

    job_id: str
    at: float


@frozen
class TaskStarted:
    job_id: str
    at: float
    task_id: int


@frozen
class TaskStartFailed:
    """A grow's task could not start: its slot is freed at this fact."""

    job_id: str
    at: float
    task_id: int
    reason: str = ""


@frozen
class TaskStopped:
    """A shrink's task is gone: its slot is freed at this fact. ``status``: its exit
    status where the host reported one."""

    job_id: str
    at: float
    task_id: int
    status: int | None = None


@frozen
class TasksStarted:
    """Several of a grow's new tasks are running (:class:`TaskStarted` for each, as one
    fact: a grow of thousands of tasks writes one record, not thousands)."""

    job_id: str
    at: float
    task_ids: tuple[int, ...]


@frozen
class TasksStopped:
    """Several of a shrink's tasks are gone, all with the same ``status``
    (:class:`TaskStopped` for each, as one fact); their slots are freed at this fact."""

    job_id: str
    at: float
    task_ids: tuple[int, ...]
    status: int | None = None


@frozen
class GrowReverted:
    """No task of a grow started: the grow is pending again (or given up)."""

    job_id: str
    at: float
    gave_up: bool = False


@frozen
class Committed:
    """The change in flight is now the job's allocation (version ``version``)."""

    job_id: str
    at: float
    version: int


@frozen
class JobEnded:
    """The job finished: its pending grow is cancelled, in-flight slots are freed.

    ``requeued``: the host put the job back in its queue (a host failure): this run
    ended, and the job's history goes on at its next start, so ``journal compact``
    keeps its facts until a later ``JobEnded`` without it (the job started again and
    finished, or ended while it waited: that one may come on an ended state).
    """

    job_id: str
    at: float
    requeued: bool = False


# --- host failure (an involuntary shrink) --------------------------------------------


@frozen
class TasksLost:
    """A host failed and took these tasks of the job with it (docs/failover.md).

    ``tasks`` are every task of the job that was on ``host``: committed ones and those
    of the change in flight; their slots are freed at this fact. ``version`` is the
    allocation version after the loss (the job's version when no committed task was
    lost); a loss of committed tasks is an involuntary shrink with a resize record
    (reason ``host_failure``). ``attempt``: the number of the notification run for
    information (0: none runs).
    """

    job_id: str
    at: float
    host: str
    tasks: tuple[Task, ...]
    version: int
    attempt: int = 0
    notify_cmd: str | None = None
    #: Why the tasks are gone: ``host_failure``, or ``task_exit`` when a task of a
    #: ``release_exited`` job exited on its own (the resize record's reason).
    reason: str = "host_failure"


# --- readiness (docs/in-job-api.md, "Readiness and exits") ---------------------------


@frozen
class TaskReady:
    """Tasks of the job said they are ready for work."""

    job_id: str
    at: float
    task_ids: tuple[int, ...]


@frozen
class ReadyTimedOut:
    """A grow's readiness deadline passed: ``task_ids``, its tasks not ready, failed
    (stopped, their slots freed at this fact)."""

    job_id: str
    at: float
    task_ids: tuple[int, ...]


# --- drain before stop, exits outside a change -----------------------------------------


@frozen
class TasksDrained:
    """The job acknowledged these tasks of the release being drained: they may stop."""

    job_id: str
    at: float
    task_ids: tuple[int, ...]
    principal: str


@frozen
class DrainEnded:
    """The drain is over and the release's tasks are stopped now. ``reason``:
    ``deadline`` (the drain time passed) or ``drained`` (every task acknowledged)."""

    job_id: str
    at: float
    reason: str


@frozen
class TaskExited:
    """A task of the committed allocation, outside any change, exited on its own (it
    stays in the allocation until a release takes it): a job event, no state change."""

    job_id: str
    at: float
    task_id: int
    status: int | None = None
    reason: str = ""


Fact = (
    JobTracked
    | GrowRequested
    | GrowCancelled
    | GrowPlaced
    | ReleaseAccepted
    | NotifyStarted
    | NotifyDone
    | TasksLaunched
    | TaskStarted
    | TaskStartFailed
    | TaskStopped
    | TasksStarted
    | TasksStopped
    | GrowReverted
    | Committed
    | JobEnded
    | AutoresizeSet
    | TasksLost
    | TaskReady
    | ReadyTimedOut
    | TasksDrained
    | DrainEnded
    | TaskExited
    | TargetSet
)

FACT_TYPES: tuple[type, ...] = (
    JobTracked,
    GrowRequested,
    GrowCancelled,
    GrowPlaced,
    ReleaseAccepted,
    NotifyStarted,
    NotifyDone,
    TasksLaunched,
    TaskStarted,
    TaskStartFailed,
    TaskStopped,
    TasksStarted,
    TasksStopped,
    GrowReverted,
    Committed,
    JobEnded,
    AutoresizeSet,
    TasksLost,
    TaskReady,
    ReadyTimedOut,
    TasksDrained,
    DrainEnded,
    TaskExited,
    TargetSet,
)
