"""The engine's view of site policy, forwarded to the policy hooks.

Typed forwarding methods around ``pm.hook`` (as tox 4 does) so that every call site is
checked by mypy, and so that a site hook that raises something unexpected, or answers
something that is not what its hook asks for, becomes a clear ``PolicyRejected`` naming
the hook instead of a stray exception in the middle of a scheduler cycle or a host
failure (docs/admin-guide.md, "When a policy hook fails").
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, SupportsIndex

import pluggy

from xce_resize_plugin.core.allocations import plain_ints
from xce_resize_plugin.core.models import JobInfo, ResizeRecord, ResizeRequest, Task
from xce_resize_plugin.core.placement import GrowHostView, default_grow_order
from xce_resize_plugin.core.reclaim import ReclaimCandidate, ReclaimHead, Selection
from xce_resize_plugin.errors import PolicyRejected, ResizeError
from xce_resize_plugin.host import Principal

log = logging.getLogger(__name__)

_ORDER = "xce_resize_order_grow_hosts"
_COMMITTED = "xce_resize_committed"


_END = object()

#: What a site hook's failure is: any exception, and ``sys.exit()`` too, which would
#: otherwise end the thread that called the hook (the live controller's loop, silently).
SiteFailure = (Exception, SystemExit)


def _raised(hook: str, exc: BaseException) -> PolicyRejected:
    """A site hook's own exception, as the refusal that names the hook."""
    return PolicyRejected(f"{hook} raised {type(exc).__name__}: {exc}")


def _task_ids(hook: str, answer: object, most: int, whose: str = "") -> tuple[int, ...]:
    """``answer`` as task ids: any iterable of integers (a list, a tuple, a generator),
    not a string, and no ``True`` or ``3.0`` standing in for an id. More than ``most``
    ids (every id the hook could name) is refused once one more is read: an endless
    answer (``itertools.count()``) took all the memory of the machine."""
    if isinstance(answer, str | bytes) or not isinstance(answer, Iterable):
        raise PolicyRejected(f"{hook} returned {answer!r}{whose}, not a list of task ids")
    try:
        items = iter(answer)
        ids = tuple(itertools.islice(items, most))
        if next(items, _END) is not _END:
            raise PolicyRejected(
                f"{hook} returned more than {most} task ids{whose}, more than it could "
                "choose from: an endless answer?"
            )
    except ResizeError:
        raise
    except SiteFailure as exc:  # a generator of the site's that fails on the way
        raise _raised(hook, exc) from exc
    if plain_ints(ids):
        return ids  # the usual answer
    try:
        return tuple(_task_id(i) for i in ids)
    except TypeError:
        raise PolicyRejected(
            f"{hook} returned {list(ids)!r}{whose}: task ids are integers"
        ) from None


def _task_id(value: object) -> int:
    """An int, or an integer of another kind (numpy's); ``TypeError`` for anything else."""
    if type(value) is int:  # the usual answer; SupportsIndex's isinstance is slow (Protocol)
        return value
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise TypeError(f"{value!r} is not a task id")
    return operator.index(value)


#: The most names of an order hook's answer read per host of the cycle. A useful order
#: names each host once; repeats and unknown names are skipped, but an answer longer
#: than this is taken for an endless one (``itertools.cycle`` over full hosts), which
#: would otherwise hold the scheduler for ever.
ORDER_NAMES_PER_HOST = 4


def _host_names(job: JobInfo, answer: Iterable[object], limit: int) -> Iterator[str]:
    """The order hook's answer read lazily, each name checked as it is read; a name
    beyond the first ``limit`` raises :class:`PolicyRejected`."""
    names: Iterator[object] | None = None
    for read in range(limit + 1):
        try:
            if names is None:
                names = iter(answer)
            host = next(names)
        except StopIteration:
            return
        except ResizeError:
            raise
        except SiteFailure as exc:
            raise _raised(_ORDER, exc) from exc
        if read == limit:
            raise PolicyRejected(
                f"{_ORDER} gave more than {limit} names for job {job.id} "
                f"({ORDER_NAMES_PER_HOST} per host of the cycle): an endless order?"
            )
        if not isinstance(host, str):
            raise PolicyRejected(f"{_ORDER} gave {host!r} for job {job.id}, not a host name")
        yield host


class HookPolicy:
    """Implements :class:`xce_resize_plugin.core.engine.Policy` through the policy hooks."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._hook = pm.hook

    def _call(self, hook: str, **kwargs: object) -> Any:
        """Policy hook ``hook``'s answer; a site hook's own exception becomes the refusal
        that names the hook (a :class:`ResizeError` is the site's own refusal)."""
        try:
            return getattr(self._hook, hook)(**kwargs)
        except ResizeError:
            raise
        except SiteFailure as exc:
            raise _raised(hook, exc) from exc

    def authorize(self, principal: Principal, job: JobInfo, action: str) -> bool:
        """``None`` from every implementation denies; an answer that is not a bool
        (``"no"`` is true in Python) is refused rather than taken as allowing."""
        try:
            result = self._hook.xce_resize_authorize(principal=principal, job=job, action=action)
        except SystemExit as exc:
            # An exception stays a bug (a 500 over REST, its text not shown: it may say
            # more about other users than the caller may know); sys.exit() ended the
            # thread that asked, the live controller's loop among them.
            raise RuntimeError(f"xce_resize_authorize called sys.exit({exc.code!r})") from None
        if result is None or isinstance(result, bool):
            return bool(result)
        raise PolicyRejected(
            f"xce_resize_authorize returned {result!r} for {action} on job {job.id}, "
            "not True, False or None"
        )

    def validate(self, job: JobInfo, request: ResizeRequest) -> None:
        try:
            self._hook.xce_resize_validate(job=job, request=request)
        except ResizeError:
            raise
        except SiteFailure as exc:  # a site rule's own exception carries the site's message
            raise PolicyRejected(str(exc) or type(exc).__name__) from exc

    def select_release(self, job: JobInfo, candidates: Sequence[Task], count: int) -> Sequence[int]:
        """The ids the hook chose (the engine checks them against the candidates)."""
        hook = "xce_resize_select_release"
        result = self._call(hook, job=job, candidates=candidates, count=count)
        return _task_ids(hook, result, len(candidates)) if result is not None else []

    def order_grow_hosts(self, job: JobInfo, hosts: GrowHostView) -> Iterable[str]:
        """Host names, lazily; a name that is not a string, or the hook failing while
        it is read, raises :class:`PolicyRejected` from the iterator."""
        result = self._call(_ORDER, job=job, hosts=hosts)
        if result is None:
            return default_grow_order(job, hosts)
        if isinstance(result, str | bytes) or not isinstance(result, Iterable):
            raise PolicyRejected(
                f"{_ORDER} returned {result!r} for job {job.id}, not a list of host names"
            )
        return _host_names(job, result, ORDER_NAMES_PER_HOST * max(len(hosts), 1))

    def host_lost(self, job: JobInfo, lost_task_ids: Sequence[int]) -> str:
        """``"exit"`` or ``"requeue"`` for a job a failed host took tasks from; a site
        answer that is neither, or a site hook that raises, is refused with the hook's
        name."""
        hook = "xce_resize_host_lost"
        result = self._call(hook, job=job, lost_task_ids=tuple(lost_task_ids))
        answer = "exit" if result is None else result
        if answer not in ("exit", "requeue"):
            raise PolicyRejected(f"{hook} returned {answer!r}, not exit or requeue")
        return str(answer)

    def committed(self, job: JobInfo, change: ResizeRecord) -> None:
        """Tell the sites' ``xce_resize_committed`` hooks about a committed change.

        The change is committed already: an implementation that raises is logged,
        naming it, and the others are told all the same."""
        caller = self._hook.xce_resize_committed
        impls = caller.get_hookimpls()
        if len(impls) <= 1:
            self._tell(caller, impls, job, change)
            return
        plugins = [impl.plugin for impl in impls]
        for impl in reversed(impls):  # pluggy's own order
            others = [p for p in plugins if p is not impl.plugin]
            self._tell(self._pm.subset_hook_caller(_COMMITTED, others), [impl], job, change)

    @staticmethod
    def _tell(
        caller: pluggy.HookCaller,
        impls: Sequence[pluggy.HookImpl],
        job: JobInfo,
        change: ResizeRecord,
    ) -> None:
        try:
            caller(job=job, change=change)
        except SiteFailure:
            where = ", ".join(f"{i.function.__qualname__} in {i.plugin_name}" for i in impls)
            log.exception(
                "%s (%s) raised on job %s's %s to version %d; the change stands",
                _COMMITTED,
                where,
                job.id,
                change.kind.value,
                change.version,
            )

    # -- reclaim ------------------------------------------------------------------------

    def select_reclaim(
        self, head: ReclaimHead, candidates: Sequence[ReclaimCandidate]
    ) -> Selection:
        """The tasks to reclaim for ``head`` (job id -> task ids; empty: none)."""
        hook = "xce_resize_select_reclaim"
        result = self._call(hook, head=head, candidates=candidates)
        if result is None:
            return {}
        try:
            chosen: dict[str, object] = dict(result)
        except (TypeError, ValueError):
            raise PolicyRejected(
                f"{hook} returned {result!r}, not a mapping job id -> task ids"
            ) from None
        most = {c.job.id: len(c.releasable) for c in candidates}
        # A job that is no candidate is refused by check_selection, naming it.
        bound = max(most.values(), default=0)
        return {
            job_id: _task_ids(hook, ids, most.get(job_id, bound), f" for job {job_id}")
            for job_id, ids in chosen.items()
        }
