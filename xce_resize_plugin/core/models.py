"""Value types of the resize domain: frozen attrs classes, no serialisation code.

Encoding for the journal and the JSON API lives in :mod:`xce_resize_plugin.core.converters`.
Everything here is immutable; state changes are made with :func:`attrs.evolve`.
The facts that change a job's :class:`ResizeState` are in :mod:`.facts`.
"""

from __future__ import annotations

import enum
import functools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any, TypeVar

from attrs import AttrsInstance, field, fields, frozen

_A = TypeVar("_A", bound=AttrsInstance)


#: The longest job id taken anywhere: the REST API refuses longer ones before any
#: lookup, the embedded controller at submission (a job's directories are named by it).
MAX_JOB_ID = 64


class JobState(enum.Enum):
    """The host's job states (LSF's names)."""

    PEND = "PEND"
    RUN = "RUN"
    DONE = "DONE"
    EXIT = "EXIT"


class GrowHosts(enum.Enum):
    """Which hosts a grow may use."""

    PREFER_EXISTING = "prefer-existing"
    NEW_ONLY = "new-only"
    ANY = "any"


class Phase(enum.Enum):
    """The resize state of one job (docs/architecture.md, "Resize semantics")."""

    IDLE = "IDLE"
    GROW_PENDING = "GROW_PENDING"
    GROW_NOTIFYING = "GROW_NOTIFYING"
    GROW_STARTING = "GROW_STARTING"
    SHRINK_NOTIFYING = "SHRINK_NOTIFYING"
    #: A release with a drain time: the tasks run on until its deadline or until the
    #: job acknowledges them drained (docs/in-job-api.md, "Drain before stop").
    SHRINK_DRAINING = "SHRINK_DRAINING"
    SHRINK_STOPPING = "SHRINK_STOPPING"
    ENDED = "ENDED"


class ChangeKind(enum.Enum):
    GROW = "grow"
    SHRINK = "shrink"


class LossOutcome(enum.Enum):
    """What became of a job that had tasks on a failed host (docs/failover.md)."""

    #: Committed tasks were lost and dropped: an involuntary shrink.
    SHRUNK = "shrunk"
    #: Only tasks of the change in flight were lost; the allocation is unchanged.
    KEPT = "kept"
    #: The job cannot lose the tasks: the host ends it (``EXIT``, reason host failure).
    EXIT = "exit"
    #: As ``EXIT``, but the site's ``xce_resize_host_lost`` asked the host to requeue it.
    REQUEUE = "requeue"


@frozen(order=True)
class Task:
    """One task of a job: its id (0 is the head task) and the host it runs on."""

    id: int
    host: str


class TasksInIdOrder(Sequence[Task]):
    """A sequence of tasks whose ids strictly ascend, said by its type.

    A host may give a job's tasks (:attr:`JobInfo.tasks`) as such a sequence when it
    knows their order (its own ids ``0..n-1`` in allocation order, say), and make them
    only when read: the plugin then takes a job's newest tasks from the end, without
    reading or sorting the others, and keeps the sequence (or its slices) in its state
    instead of a copy (docs/host-integration.md). Its ids are distinct (a job's task
    ids are), it never changes, and its slices are in id order too. Any other sequence
    is copied, and sorted when the order matters.
    """

    __slots__ = ()

    def id_host_pairs(self) -> Iterable[tuple[int, str]]:
        """``(id, host)`` of each task in order: how the journal writes an allocation.
        A host's list may make them without making its tasks."""
        return map(_id_and_host, self)

    def task_hosts(self) -> Iterable[str]:
        """The host of each task in order (the journal writes a long allocation of
        consecutive ids as its first id and these). A host's list may give them without
        making its tasks."""
        return map(_host_of, self)

    def host_positions(self) -> tuple[Sequence[str], list[tuple[int, int, int]]] | None:
        """Its tasks' hosts as runs of a sequence of host names, if it holds them so:
        ``(names, runs)``, each run ``(first, n, take)`` standing for the ``n`` names
        from ``names[first]`` on, each ``take`` times, in task order. The journal then
        reads each name's number once per ``names`` instead of once per task
        (core/task_codec.py). ``None`` (the default): only :meth:`task_hosts`."""
        return None


_id_and_host = attrgetter("id", "host")
_host_of = attrgetter("host")
_new_object = object.__new__
# The slots' own descriptors: setting through them is what attrs' frozen __init__ does
# (through object.__setattr__), without a Python call per field.
_set_id = Task.__dict__["id"].__set__
_set_host = Task.__dict__["host"].__set__


def make_tasks(ids: Iterable[int], hosts: Iterable[str]) -> tuple[Task, ...]:
    """``tuple(map(Task, ids, hosts))``, made about twice as fast: a job of many hosts
    has tens of thousands of tasks made at once (its start, its first resize, a
    recovery), and a frozen class's ``__init__`` is a Python call per task. The tasks
    are ordinary :class:`Task` objects (equal, hashed and frozen as any other); the
    first sequence ends it, as ``map`` does."""
    id_list = ids if isinstance(ids, (list, tuple, range)) else list(ids)
    host_list = hosts if isinstance(hosts, (list, tuple)) else list(hosts)
    tasks = list(map(_new_object, repeat(Task, min(len(id_list), len(host_list)))))
    deque(map(_set_id, tasks, id_list), maxlen=0)  # task.id = i for each, in C
    deque(map(_set_host, tasks, host_list), maxlen=0)
    return tuple(tasks)


def host_counts(tasks: Iterable[Task]) -> dict[str, int]:
    """Tasks per host, hosts in order of first appearance (LSF's ``hostA 2 hostB 1``)."""
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.host] = counts.get(task.host, 0) + 1
    return counts


def format_hosts(tasks: Iterable[Task]) -> str:
    """``hostA 2 hostB 1``, the form of ``LSB_RESIZE_HOSTS`` and ``LSB_MCPU_HOSTS``."""
    return " ".join(f"{host} {n}" for host, n in host_counts(tasks).items())


def allocation_env(tasks: Sequence[Task], version: int, resizable: bool) -> dict[str, str]:
    """A job's allocation as its tasks and notification commands see it, under LSF's and
    XCE's names: set by the host when the job starts, by the plugin at every change."""
    mcpu = format_hosts(tasks)
    return {
        "XCE_HOSTS": mcpu,
        "LSB_MCPU_HOSTS": mcpu,
        "LSB_HOSTS": " ".join(t.host for t in tasks),
        "XCE_ALLOC_VERSION": str(version),
        "LSB_RESIZABLE": "Y" if resizable else "N",
    }


def project(cls: type[_A], source: object, **values: Any) -> _A:
    """An instance of the attrs class ``cls`` whose fields are ``source``'s attributes
    of the same names, but for those given in ``values``: one frozen view of a record
    or a state, its fields named once, in ``cls`` (a field ``source`` lacks raises)."""
    for name in _field_names(cls):
        if name not in values:
            values[name] = getattr(source, name)
    return cls(**values)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    # Views are built on the simulator's hot path; the names of a class never change.
    return tuple(attribute.name for attribute in fields(cls))


@frozen
class JobInfo:
    """The host's view of one job, as the plugin needs it.

    The host builds it (``controller.get_job``); the plugin never changes it. ``tasks``
    is the committed allocation in allocation order: the first task is task 0 on the
    first execution host.
    """

    id: str
    user: str
    state: JobState
    min_tasks: int
    max_tasks: int
    tasks: Sequence[Task] = ()
    resizable: bool = False
    ptile: int | None = None
    grow_hosts: GrowHosts = GrowHosts.PREFER_EXISTING
    notify_cmd: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    env: Mapping[str, str] = field(factory=dict)
    #: Submitted with ``--autoresize`` (LSF's ``bsub -ar``): once running, the plugin
    #: keeps a grow pending for it up to ``max_tasks`` (docs/user-guide.md). The host
    #: only carries the submission's flag; the plugin's journal holds whether it is on
    #: now.
    autoresize: bool = False
    #: The host put the job back in the queue after a host failure (a site's
    #: ``xce_resize_host_lost`` answered "requeue"): the plugin continues its earlier
    #: run's history, which it then looks up (and only then).
    requeued: bool = False
    #: Submitted with ``release_exited``: a task other than task 0 that exits on its
    #: own while the job runs leaves the allocation (docs/in-job-api.md, "Readiness
    #: and exits").
    release_exited: bool = False
    #: The job's default drain time (seconds) for its releases (``submit --grace``):
    #: between the notification and the stop (docs/user-guide.md, "Drain before stop").
    grace: float = 0.0
    #: (Last, as every field added later: a host may pass the others by position.)
    #: How many times the host has requeued the job so far (0 on its first run; it
    #: counts every requeue, whoever decided it). The plugin requeues a job at most
    #: ``[resize] max_requeue`` times (LSF's ``MAX_JOB_REQUEUE``); a host that does not
    #: count leaves 0, and then the limit never applies.
    requeues: int = 0

    @property
    def first_host(self) -> str | None:
        return self.tasks[0].host if self.tasks else None


@frozen
class GrowRequest:
    """Ask for ``min_add..max_add`` more tasks (``bresize request [min,]max``)."""

    min_add: int
    max_add: int
    cancel_pending: bool = False
    notify_cmd: str | None = None
    no_notify: bool = False
    #: Commit only once every new task said it is ready (``ResizeClient.ready()``),
    #: waiting at most ``ready_timeout`` seconds from their launch (``None``: the
    #: site's ``[resize] max_ready_timeout``); docs/in-job-api.md.
    wait_ready: bool = False
    ready_timeout: float | None = None
    #: Refuse the grow (XCE_RESIZE_VERSION_CHANGED) unless the committed allocation is
    #: still at this version; ``None``: no condition.
    if_version: int | None = None


@frozen
class ReleaseRequest:
    """Give tasks back. Exactly one of ``spec``, ``hosts``, ``task_ids``, ``count``.

    ``spec`` is the LSF release specification (``"all ~hostB 2*hostC"``); ``hosts``
    maps a host to a task count (``None`` = all of the job's tasks there).
    """

    spec: str | None = None
    hosts: Mapping[str, int | None] | None = None
    task_ids: tuple[int, ...] | None = None
    count: int | None = None
    cancel_pending: bool = False
    notify_cmd: str | None = None
    no_notify: bool = False
    #: Drain time in seconds before the tasks are stopped (``--grace``); ``None``: the
    #: job's default (:attr:`JobInfo.grace`).
    grace: float | None = None
    #: As :attr:`GrowRequest.if_version`.
    if_version: int | None = None


@frozen
class DrainedRequest:
    """The job says these tasks of the release being drained may be stopped now
    (``ResizeClient.drained``)."""

    task_ids: tuple[int, ...]


@frozen
class CancelRequest:
    """Cancel the job's pending grow (``bresize cancel``)."""


@frozen
class AutoresizeRequest:
    """Turn the job's autoresize on or off (``xce-resize modify --autoresize`` /
    ``--no-autoresize``, LSF's ``bmod -ar`` / ``-arn``)."""

    enabled: bool


@frozen
class ReadyRequest:
    """Task ``task_id`` of the job is ready for work (``ResizeClient.ready()``)."""

    task_id: int


# --- declarative size (docs/in-job-api.md, "A target size") ---------------------------


@frozen
class TargetRequest:
    """Set the job's target size (``tasks``) or clear it (``tasks`` ``None``):
    ``PUT``/``DELETE /v1/jobs/{id}/resize/target``, ``xce-resize target``."""

    tasks: int | None
    #: Task ids to release first when the job is above its target.
    release_prefer: tuple[int, ...] = ()


@frozen
class Target:
    """A job's target size: the plugin grows or releases until the job holds ``tasks``.
    ``notify_cmd``: the job's notification command, which the target's changes run."""

    tasks: int
    release_prefer: tuple[int, ...] = ()
    notify_cmd: str | None = None


ResizeRequest = (
    GrowRequest
    | ReleaseRequest
    | CancelRequest
    | AutoresizeRequest
    | ReadyRequest
    | DrainedRequest
    | TargetRequest
)


@frozen
class PendingGrow:
    """A grow waiting for slots. ``failures`` counts consecutive failed attempts."""

    min_add: int
    max_add: int
    notify_cmd: str | None
    requested_at: float
    failures: int = 0
    #: The autoresize demand (kept by the plugin), not a grow someone asked for.
    auto: bool = False
    #: A grow with ``wait_ready``: seconds its new tasks have, from their launch, to
    #: say they are ready before it is committed (``None``: committed once started).
    ready_timeout: float | None = None


@frozen
class Change:
    """The one allocation change in flight for a job.

    ``tasks`` are the tasks added (grow) or released (shrink). ``notify_cmd`` is the
    resolved notification command (``None``: none runs). ``attempt`` numbers the
    notification runs so a late result of an earlier run is ignored. ``started`` and
    ``stopped`` are the task ids confirmed so far; ``failed`` the ids that failed to
    start (their slots were freed at once).
    """

    kind: ChangeKind
    tasks: Sequence[Task]
    notify_cmd: str | None
    since: float
    attempt: int = 0
    launched: bool = False
    started: frozenset[int] = frozenset()
    failed: frozenset[int] = frozenset()
    stopped: frozenset[int] = frozenset()
    pending: PendingGrow | None = None
    #: A grow waiting for readiness: when its tasks that are not ready by then are
    #: failed (set at its launch; ``None``: the grow does not wait).
    ready_by: float | None = None
    #: A release's drain time (seconds), its deadline once the drain began, and the
    #: task ids the job acknowledged drained (docs/in-job-api.md, "Drain before stop").
    grace: float = 0.0
    deadline: float | None = None
    drained: frozenset[int] = frozenset()


@frozen
class ResizeRecord:
    """One committed allocation change, like LSF's ``JOB_RESIZE`` accounting record."""

    time: float
    kind: ChangeKind
    before: Sequence[Task]
    delta: Sequence[Task]
    after: Sequence[Task]
    version: int
    #: Why the change happened when nobody asked for it: ``host_failure`` for an
    #: involuntary shrink (docs/failover.md); ``None`` for a requested change.
    reason: str | None = None


@frozen
class Segment:
    """A stretch of the allocation timeline during which the job held ``slots``."""

    start: float
    end: float
    slots: int

    @property
    def slot_seconds(self) -> float:
        return (self.end - self.start) * self.slots


def held_count(committed: int, change: Change | None) -> int:
    """Slots held by a job with ``committed`` tasks and ``change`` in flight (a change's
    failed and stopped tasks are among its tasks, a shrink's among the committed ones)."""
    if change is None:
        return committed
    if change.kind is ChangeKind.GROW:
        return committed + len(change.tasks) - len(change.failed)
    return committed - len(change.stopped)


@frozen
class ResizeState:
    """The plugin's materialised state of one job: a fold of the job's facts.

    ``tasks`` is the committed allocation; ``held`` the tasks whose slots the job is
    charged for (committed, plus a grow's reserved tasks, minus a shrink's stopped
    ones). ``charges`` is the charged-slots timeline as ``(time, slots)`` steps.
    """

    job_id: str
    user: str
    min_tasks: int
    max_tasks: int
    tasks: Sequence[Task]
    started_at: float
    phase: Phase = Phase.IDLE
    pending: PendingGrow | None = None
    change: Change | None = None
    next_task_id: int = 0
    version: int = 0
    ended_at: float | None = None
    records: tuple[ResizeRecord, ...] = ()
    charges: tuple[tuple[float, int], ...] = ()
    notify_attempts: int = 0
    #: Autoresize is on: while the job is idle below ``max_tasks`` a grow of
    #: ``1..max_tasks - len(tasks)`` pends for it (``pending.auto``), with the job's
    #: notification command ``autoresize_notify``.
    autoresize: bool = False
    autoresize_notify: str | None = None
    #: Ids of the held tasks that said they are ready (``ResizeClient.ready()``).
    ready: frozenset[int] = frozenset()
    #: The job's target size, if one is set (exclusive with autoresize): the plugin's
    #: demand then grows to ``target.tasks`` and it releases down to it.
    target: Target | None = None
    #: The run ended because the host requeued the job (``JobEnded.requeued``): its
    #: history goes on at the job's next start, and compaction keeps it meanwhile.
    requeued: bool = False

    @property
    def held(self) -> Sequence[Task]:
        change = self.change
        if change is None:
            return self.tasks if self.ended_at is None else ()
        if change.kind is ChangeKind.GROW:
            return (*self.tasks, *(t for t in change.tasks if t.id not in change.failed))
        return tuple(t for t in self.tasks if t.id not in change.stopped)

    @property
    def held_count(self) -> int:
        """``len(self.held)`` without building it."""
        if self.change is None and self.ended_at is not None:
            return 0
        return held_count(len(self.tasks), self.change)

    @property
    def live(self) -> bool:
        return self.phase is not Phase.ENDED


@frozen
class Principal:
    """Who is asking: a user name, whether the host counts them as an administrator,
    and for a job token the job it belongs to (``job_id``)."""

    name: str
    admin: bool = False
    job_id: str | None = None

    def may_act_on(self, job_id: str, owner: str) -> bool:
        """Whether this principal may see and act on the job ``job_id`` of ``owner``.

        A job's token reaches its own job only (never another job of the same owner);
        anyone else must be the job's owner or an administrator.
        """
        if self.job_id is not None:
            return self.job_id == job_id
        return self.admin or self.name == owner


@frozen
class TaskEvent:
    """A task's life as the host saw it: ``started``, ``start_failed``, ``exited``.

    ``exited`` covers a task stopped at the plugin's request and one that ended or was
    lost on its own; ``status`` is the exit status where there is one.
    """

    job_id: str
    task_id: int
    kind: str
    status: int | None = None
    reason: str = ""
    #: An ``exited`` task the host had asked to stop (a release, the job's end), not
    #: one that ended on its own.
    stopped: bool = False
