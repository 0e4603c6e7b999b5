"""Hosts, their slots, and who holds them.

The cluster is the embedded controller's single ledger of charged slots: a slot is held
by one task id of one job on one host, from ``reserve`` to ``free``. Everything else
(host usage, per-user usage, the scheduler's free-slot view, limits) is derived from
that ledger, so overbooking or a leak shows up in exactly one place.

Both ``reserve`` and ``free`` are idempotent per task id because the plugin re-issues
them after a failover (docs/failover.md). A reservation that does not fit is a bug of the
caller and raises at once instead of being trimmed: the plugin is supposed to check the
free-slot view and ``slot_headroom`` first.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from functools import partial
from itertools import chain, repeat
from operator import add, attrgetter, le, sub

from xce_resize_plugin.controllers.lazy import TaskList, Unfolded
from xce_resize_plugin.controllers.placement_runs import Placement, Run
from xce_resize_plugin.controllers.slots import FreeSlots
from xce_resize_plugin.controllers.violations import ContractViolation
from xce_resize_plugin.core.models import Task, make_tasks


class HostState(enum.Enum):
    """A host's state as the scheduler sees it (docs/admin-guide.md, "Host states").

    ``ok`` takes tasks; ``closed`` (an administrator's drain) takes no new task while
    the tasks on it go on; ``unavail`` (failed) holds no task and takes none until it
    comes back up. A closed host that fails is ``unavail``, and closed again once up.
    """

    OK = "ok"
    CLOSED = "closed"
    UNAVAIL = "unavail"


class Cluster:
    """Ordered hosts with their slot counts, the held slots, and per-user limits.

    :param hosts: ``(name, slots)`` pairs or a mapping, in host order (the order the
        scheduler fills hosts in and the order of every view).
    :param user_slots: per-user slot limits (``[limits] user_slots``); users not
        listed are unlimited.
    """

    def __init__(
        self,
        hosts: Mapping[str, int] | Iterable[tuple[str, int]],
        user_slots: Mapping[str, int] | None = None,
    ) -> None:
        pairs = list(hosts.items()) if isinstance(hosts, Mapping) else list(hosts)
        if not pairs:
            raise ValueError("a cluster needs at least one host")
        self._slots: dict[str, int] = {}
        for name, slots in pairs:
            if name in self._slots:
                raise ValueError(f"host {name!r} listed twice")
            if not isinstance(slots, int) or slots < 0:
                raise ValueError(f"host {name!r}: slots must be a non-negative integer")
            self._slots[name] = slots
        self._limits: dict[str, int] = dict(user_slots or {})
        for user, limit in self._limits.items():
            if not isinstance(limit, int) or limit < 0:
                raise ValueError(f"user {user!r}: slot limit must be a non-negative integer")
        # Slots and slots in use per host position (the free-slot view's order), so
        # that a run of hosts is read and written as a slice; slots restored on a host
        # the configuration no longer has are counted apart.
        self._pos: dict[str, int] = {h: i for i, h in enumerate(self._slots)}
        self._cap: list[int] = list(self._slots.values())
        self._used: list[int] = [0] * len(self._cap)
        self._used_elsewhere: dict[str, int] = {}
        # Every host has these slots (a machine of alike hosts), else None.
        self._alike = self._cap[0] if len(set(self._cap)) == 1 else None
        # Free slots per host, kept up to date with every change as counts per class of
        # hosts and in host order: the scheduler reads them at every pass, at a cost
        # that does not grow with the number of hosts.
        self._free = FreeSlots(list(self._slots), list(self._slots.values()))
        # Per job, task id -> host (made on first use for a job started by runs).
        self._held: dict[str, MutableMapping[int, str]] = {}
        # Jobs whose held slots are still exactly the runs they were started with:
        # ended in steps per run, not per host.
        self._runs: dict[str, Placement] = {}
        # Hosts taken out of scheduling: failed (down) and closed by an administrator.
        # Few: a state change costs O(1) in the free-slot view (FreeSlots.disable).
        self._down: set[str] = set()
        self._closed: set[str] = set()
        # Per job, slots per host: kept incrementally because the scheduler asks for it
        # for every running job whenever the queue head is blocked.
        self._job_hosts: dict[str, MutableMapping[str, int]] = {}
        self._owner: dict[str, str] = {}
        self._user_used: dict[str, int] = {}
        #: Slots ever taken (a counter that only grows): what was taken since a moment.
        self.taken_count = 0
        #: Bumped whenever slots are freed: the scheduler only needs a new pass when
        #: slots were freed or jobs arrived (see EmbeddedController._host_pass).
        self.free_epoch = 0
        #: Bumped whenever slots are taken or freed (any change of the ledger).
        self.change_epoch = 0

    # -- configuration -------------------------------------------------------------

    @property
    def hosts(self) -> dict[str, int]:
        """Host name -> slots, in host order (a copy)."""
        return dict(self._slots)

    @property
    def user_limits(self) -> dict[str, int]:
        return dict(self._limits)

    @property
    def capacity(self) -> int:
        return sum(self._slots.values())

    def has_host(self, name: str) -> bool:
        return name in self._slots

    # -- host states -------------------------------------------------------------------

    def host_state(self, name: str) -> HostState:
        """The host's state (``KeyError`` for a host the cluster does not have)."""
        if name not in self._slots:
            raise KeyError(name)
        if name in self._down:
            return HostState.UNAVAIL
        return HostState.CLOSED if name in self._closed else HostState.OK

    def set_down(self, name: str, down: bool) -> None:
        """Mark ``name`` failed (``True``) or back up; no checks of the transition."""
        (self._down.add if down else self._down.discard)(name)
        self._refresh(name)

    def set_closed(self, name: str, closed: bool) -> None:
        """Close ``name`` to new tasks (``True``) or open it; no checks of the transition."""
        (self._closed.add if closed else self._closed.discard)(name)
        self._refresh(name)

    def _refresh(self, name: str) -> None:
        if name in self._down or name in self._closed:
            self._free.disable(name)
        else:
            self._free.enable(name, max(0, self._slots[name] - self.used(name)))
        self.change_epoch += 1
        self.free_epoch += 1  # the scheduler's next pass must look again

    def failed_hosts(self) -> list[str]:
        """The failed (``unavail``) hosts, in host order (O(1) when there are none)."""
        down = self._down
        return [h for h in self._slots if h in down] if down else []

    def is_closed(self, name: str) -> bool:
        """Whether an administrator closed ``name`` (whether or not it is also down)."""
        return name in self._closed

    def out_of_service(self) -> frozenset[str]:
        """The hosts that take no new tasks (closed or failed)."""
        return frozenset(self._down | self._closed)

    def takes_tasks(self, name: str) -> bool:
        """Whether new tasks may go to ``name`` (known, not closed, not failed)."""
        return self._free.enabled(name)

    def jobs_on(self, name: str) -> dict[str, int]:
        """Job id -> slots it holds on ``name`` (O(jobs): for views and host failures)."""
        return {job: hosts[name] for job, hosts in self._job_hosts.items() if hosts.get(name)}

    def held_on(self, job_id: str, name: str) -> list[int]:
        """The task ids ``job_id`` holds on ``name``, in reservation order."""
        return [tid for tid, host in self._held.get(job_id, {}).items() if host == name]

    def schedulable_count(self, job_id: str) -> int:
        """Slots ``job_id`` holds on hosts that take tasks: what its end gives back to
        the scheduler (a closed or failed host's slots are not given back)."""
        n = len(self._held.get(job_id, ()))
        if self._down or self._closed:
            hosts = self._job_hosts.get(job_id, {})
            n -= sum(hosts.get(h, 0) for h in self._down | self._closed)
        return n

    # -- jobs ------------------------------------------------------------------------

    def register_job(self, job_id: str, user: str) -> None:
        """Tell the ledger whom ``job_id``'s slots are charged to (before reserving)."""
        self._owner[job_id] = user

    def forget_job(self, job_id: str) -> None:
        """Drop an ended job from the ledger once it holds nothing."""
        if self._held.get(job_id):
            raise ContractViolation(f"job {job_id} still holds slots")
        self._held.pop(job_id, None)
        self._job_hosts.pop(job_id, None)
        self._owner.pop(job_id, None)
        self._runs.pop(job_id, None)

    # -- the ledger ------------------------------------------------------------------

    def reserve(self, job_id: str, tasks: Sequence[Task]) -> list[Task]:
        """Charge ``job_id`` for these tasks' slots; return the tasks newly charged.

        A task id the job already holds on the same host is skipped (idempotent). The
        whole call is checked before anything changes, so a failing call changes
        nothing. Raises :class:`ContractViolation` for an unknown host, a task id held
        on another host, a host without enough free slots, or a user over its limit.
        """
        user = self._owner.get(job_id)
        if user is None:
            raise ContractViolation(f"job {job_id} is not known to the cluster")
        held = self._held.get(job_id, {})
        new: dict[int, Task] = {}
        for task in tasks:
            if task.host not in self._slots:
                raise ContractViolation(f"job {job_id} task {task.id}: unknown host {task.host!r}")
            where = held.get(task.id) or (new[task.id].host if task.id in new else None)
            if where is None:
                new[task.id] = task
            elif where != task.host:
                raise ContractViolation(
                    f"job {job_id} task {task.id} is held on {where}, not {task.host}"
                )
        per_host: dict[str, int] = {}
        for task in new.values():
            per_host[task.host] = per_host.get(task.host, 0) + 1
        for host, n in per_host.items():
            if not self._free.enabled(host):
                raise ContractViolation(
                    f"job {job_id}: {n} slot(s) on {host}, which is {self.host_state(host).value}"
                )
            if self.used(host) + n > self._slots[host]:
                raise ContractViolation(
                    f"job {job_id}: {n} more slot(s) on {host} exceed its "
                    f"{self._slots[host]} slots ({self.used(host)} in use)"
                )
        limit = self._limits.get(user)
        if limit is not None and self._user_used.get(user, 0) + len(new) > limit:
            raise ContractViolation(
                f"job {job_id}: {len(new)} more slot(s) exceed user {user}'s limit of {limit}"
            )
        self._apply(job_id, user, new.values())
        return list(new.values())

    def allocate(self, job_id: str, placement: Sequence[tuple[str, int]]) -> Sequence[Task]:
        """Charge a job that holds nothing yet for tasks ``0..n-1`` placed as
        ``placement`` says (``(host, count)`` pairs in allocation order); return them.

        The host's own job start: checked per host and against the user's limit like
        :meth:`reserve`, but in bulk (a trace simulation starts hundreds of thousands
        of jobs; the per-task checks of :meth:`reserve` were a good part of it).
        """
        user = self._owner.get(job_id)
        if user is None:
            raise ContractViolation(f"job {job_id} is not known to the cluster")
        if self._held.get(job_id):
            raise ContractViolation(f"job {job_id} already holds slots")
        if isinstance(placement, Placement) and placement.runs is not None:
            if placement.names is self._free.names:
                tasks = self._allocate_runs(job_id, user, placement)
                if tasks is not None:
                    return tasks
            placement = placement.pairs()  # checked host by host below
        if len(placement) == 1:
            host, count = placement[0]
            return self._allocate_on_one(job_id, user, host, count)
        per_host = dict(placement)
        if len(per_host) != len(placement):  # a host twice: add its counts up
            per_host = {}
            for host, count in placement:
                per_host[host] = per_host.get(host, 0) + count
        total = self._check_allocation(job_id, per_host)
        hosts, counts = tuple(per_host), tuple(per_host.values())
        if len(per_host) == len(placement):
            names = list(chain.from_iterable(map(repeat, hosts, counts)))
        else:
            names = [host for host, count in placement for _ in range(count)]
        self._charge(job_id, user, total, dict(enumerate(names)), per_host)
        used_at, idx = self._used, list(map(self._pos.__getitem__, hosts))
        used = list(map(add, map(used_at.__getitem__, idx), counts))
        for i, u in zip(idx, used, strict=True):
            used_at[i] = u
        # Checked above: no host goes over its slots, so what is left is >= 0.
        left = map(sub, map(self._slots.__getitem__, hosts), used)
        self._free.set_many(tuple(zip(hosts, left, strict=True)))
        return make_tasks(range(total), names)

    def _allocate_runs(self, job_id: str, user: str, placement: Placement) -> TaskList | None:
        """:meth:`allocate` of a placement held as runs (``None`` if a run's hosts are
        not alike, for the host-by-host path to check): the job's task and host maps
        are made only when read, so a start costs steps per run, not per host."""
        assert placement.runs is not None
        plan = self._plan_runs(placement.runs, 1)
        if plan is None:
            return None
        total = placement.total
        held: Unfolded[int, str] = Unfolded(partial(_task_hosts, placement), total)
        hosts: Unfolded[str, int] = Unfolded(partial(dict, placement), placement.host_count())
        self._charge(job_id, user, total, held, hosts)
        self._apply_runs(plan)
        self._runs[job_id] = placement
        return TaskList(placement)

    def _plan_runs(
        self, runs: Sequence[Run], sign: int
    ) -> list[tuple[int, int, int, int, int, int]] | None:
        """For taking (``sign`` 1) or giving back (-1) ``runs``: per run the first
        position, hosts, slots in use before and after and free slots before and
        after; ``None`` when a run's hosts differ in slots or use, are taken out, or
        would go over their slots (the host-by-host path then checks and names it)."""
        used, cap, off, alike = self._used, self._cap, self._free.off, self._alike
        plan = []
        for first, n, take in runs:
            if off and any(first <= i < first + n for i in off):
                return None
            u = used[first : first + n]
            u0 = u[0]
            if u.count(u0) != n:
                return None
            if alike is not None:
                c0 = alike
            else:
                c = cap[first : first + n]
                c0 = c[0]
                if c.count(c0) != n:
                    return None
            after = u0 + sign * take
            if after < 0 or (sign > 0 and after > c0):
                return None
            plan.append((first, n, u0, after, max(0, c0 - u0), max(0, c0 - after)))
        return plan

    def _apply_runs(self, plan: Iterable[tuple[int, int, int, int, int, int]]) -> None:
        used, free = self._used, self._free
        for first, n, _, after, free_before, free_after in plan:
            used[first : first + n] = [after] * n
            free.set_run(first, n, free_before, free_after)

    def _allocate_on_one(self, job_id: str, user: str, host: str, count: int) -> tuple[Task, ...]:
        """:meth:`allocate` on one host: the same checks, messages and changes, without
        the per-host maps (most jobs of a trace run on one host: one slot each)."""
        slots = self._slots.get(host)
        if (
            slots is None
            or count < 1
            or not self._free.enabled(host)
            or self._used[self._pos[host]] + count > slots
        ):
            self._check_allocation(job_id, {host: count})  # raises, naming what is wrong
        assert slots is not None
        self._charge(job_id, user, count, dict.fromkeys(range(count), host), {host: count})
        i = self._pos[host]  # a known host: checked above
        used = self._used[i] = self._used[i] + count
        self._free.set(host, slots - used)
        return make_tasks(range(count), (host,) * count)

    def _charge(
        self,
        job_id: str,
        user: str,
        total: int,
        held: MutableMapping[int, str],
        per_host: MutableMapping[str, int],
    ) -> None:
        """The part of :meth:`allocate` every placement shares: the user's limit (checked
        before anything changes), then the job's tasks, hosts and the counters; the
        caller then updates its hosts' use."""
        limit = self._limits.get(user)
        if limit is not None and self._user_used.get(user, 0) + total > limit:
            raise ContractViolation(
                f"job {job_id}: {total} slot(s) exceed user {user}'s limit of {limit}"
            )
        self._held[job_id] = held
        self._job_hosts[job_id] = per_host
        self.change_epoch += 1
        self.taken_count += total
        self._user_used[user] = self._user_used.get(user, 0) + total

    def _check_allocation(self, job_id: str, per_host: Mapping[str, int]) -> int:
        """The slots of a whole allocation (``per_host``: host -> tasks), checked that
        every host is known, takes tasks and has them free; return the total.

        The common case (all fine) is checked in C over every host at once; the first
        host at fault is then looked for one by one for the message.
        """
        slots, used_at, pos, free = self._slots, self._used, self._pos, self._free
        hosts, counts = tuple(per_host), tuple(per_host.values())
        known = all(map(slots.__contains__, hosts))
        if (
            known
            and not self._down
            and not self._closed
            and min(counts, default=1) >= 1
            and all(
                map(
                    le,
                    map(add, map(used_at.__getitem__, map(pos.__getitem__, hosts)), counts),
                    map(slots.__getitem__, hosts),
                )
            )
        ):
            return sum(counts)
        for host, count in per_host.items():
            if host not in slots:
                raise ContractViolation(f"job {job_id}: unknown host {host!r}")
            if not free.enabled(host):
                raise ContractViolation(
                    f"job {job_id}: {host} is {self.host_state(host).value}: no new tasks"
                )
            in_use = used_at[pos[host]]
            if count < 1 or in_use + count > slots[host]:
                raise ContractViolation(
                    f"job {job_id}: {count} slot(s) on {host} exceed its "
                    f"{slots[host]} slots ({in_use} in use)"
                )
        return sum(counts)

    def release_all(self, job_id: str) -> int:
        """Free everything ``job_id`` holds, in bulk (per host, not per task); return
        how many slots were freed."""
        held = self._held.get(job_id)
        if not held:
            return 0
        user = self._owner[job_id]
        hosts = self._job_hosts[job_id]
        placement = self._runs.pop(job_id, None)
        if placement is not None and placement.runs is not None:
            plan = self._plan_runs(placement.runs, -1)
            if plan is not None:  # as started: run by run
                self._apply_runs(plan)
                return self._released(job_id, user, held, hosts)
        slots, used_at, pos = self._slots, self._used, self._pos
        if len(hosts) == 1:  # most jobs of a trace: one host, no per-host maps
            ((host, count),) = hosts.items()
            in_use = self._use(host, -count)
            if in_use is not None:
                self._free.set(host, max(0, slots[host] - in_use))
            return self._released(job_id, user, held, hosts)
        for host, count in hosts.items():
            if host not in pos:
                self._use(host, -count)
        # Host by host, but each step in C: a resized job of many hosts ends here.
        names = tuple(filter(pos.__contains__, hosts))
        counts = tuple(map(hosts.__getitem__, names))
        idx = list(map(pos.__getitem__, names))
        used = list(map(sub, map(used_at.__getitem__, idx), counts))
        deque(map(used_at.__setitem__, idx, used), maxlen=0)  # used_at[i] = u for each
        left = list(map(sub, map(slots.__getitem__, names), used))
        if min(left, default=0) < 0:  # over its slots (restored after a shrink)
            left = [max(0, n) for n in left]
        self._free.set_many(tuple(zip(names, left, strict=True)))
        return self._released(job_id, user, held, hosts)

    def _released(
        self,
        job_id: str,
        user: str,
        held: MutableMapping[int, str],
        hosts: MutableMapping[str, int],
    ) -> int:
        """The end of :meth:`release_all`, once the hosts' counts are updated."""
        n = len(held)
        held.clear()
        hosts.clear()
        self._user_used[user] -= n
        self.free_epoch += 1
        self.change_epoch += 1
        return n

    def restore(self, job_id: str, user: str, held: Mapping[int, str]) -> None:
        """Reload a job's held slots from the store without checks.

        A restart may come with a changed configuration (fewer slots, lower limits);
        refusing to start would strand the jobs, so the excess is reported by
        :meth:`check` instead.
        """
        self._owner[job_id] = user
        self._apply(job_id, user, (Task(tid, host) for tid, host in held.items()))

    def _apply(self, job_id: str, user: str, tasks: Iterable[Task]) -> None:
        held = self._held.setdefault(job_id, {})
        hosts = self._job_hosts.setdefault(job_id, {})
        self._runs.pop(job_id, None)  # no longer what it started with
        slots, free = self._slots, self._free
        n = 0
        self.change_epoch += 1
        for task in tasks:
            host = task.host
            held[task.id] = host
            hosts[host] = hosts.get(host, 0) + 1
            used = self._use(host, 1)
            if used is not None:
                free.set(host, max(0, slots[host] - used))
            n += 1
        if n:
            self._user_used[user] = self._user_used.get(user, 0) + n
            self.taken_count += n

    def free(self, job_id: str, task_ids: Iterable[int]) -> int:
        """Stop charging ``job_id`` for these task ids; unknown ids are ignored.
        Returns how many were freed."""
        held = self._held.get(job_id)
        if not held:
            return 0
        user = self._owner[job_id]
        hosts = self._job_hosts[job_id]
        placement = self._runs.pop(job_id, None)  # no longer what it started with
        if placement is not None and placement.runs is not None:
            task_ids = task_ids if isinstance(task_ids, (list, tuple)) else list(task_ids)
            freed_n = self._free_newest(job_id, user, placement, task_ids)
            if freed_n:
                return freed_n
        if isinstance(held, Unfolded):
            held = held.unfold()  # one dict for the pops below
        # The hosts of the ids held (popped in C; unknown ids give None).
        freed = [h for h in map(held.pop, task_ids, repeat(None)) if h is not None]
        if not freed:
            return 0
        # Per host, not per task: a shrink of a large job frees thousands at once.
        per_host = Counter(freed)
        slots = self._slots
        changes = []
        for host, n in per_host.items():
            left = hosts[host] - n
            if left:
                hosts[host] = left
            else:
                del hosts[host]
            used = self._use(host, -n)
            if used is not None:
                changes.append((host, max(0, slots[host] - used)))
        self._free.set_many(changes)
        self._user_used[user] -= len(freed)
        self.free_epoch += 1
        self.change_epoch += 1
        return len(freed)

    def _free_newest(
        self, job_id: str, user: str, placement: Placement, task_ids: Sequence[int]
    ) -> int:
        """:meth:`free` of a job still held as the runs it started with, when the ids
        are its newest tasks (what a shrink takes by default): run by run, and what it
        keeps stays runs, so that its next shrink and its end cost steps per run too.
        0, changing nothing, when that is not the case."""
        n, k = placement.total, len(task_ids)
        if not 0 < k < n or min(task_ids) != n - k or max(task_ids) != n - 1:
            return 0
        if len(set(task_ids)) != k:
            return 0
        kept, gone = placement.split(n - k)
        plan = self._plan_runs(gone, -1)
        if plan is None:
            return 0
        held, hosts = self._held[job_id], self._job_hosts[job_id]
        if not isinstance(held, Unfolded) or not isinstance(hosts, Unfolded):
            return 0
        self._apply_runs(plan)
        # The same map objects: the scheduler's view of the job holds its hosts.
        held.refold(partial(_task_hosts, kept), n - k)
        hosts.refold(partial(dict, kept), kept.host_count())
        self._runs[job_id] = kept
        self._user_used[user] -= k
        self.free_epoch += 1
        self.change_epoch += 1
        return k

    def free_job(self, job_id: str) -> int:
        """Free everything ``job_id`` holds; returns how many slots."""
        return self.free(job_id, list(self._held.get(job_id, {})))

    # -- views -----------------------------------------------------------------------

    def held(self, job_id: str) -> dict[int, str]:
        """Task id -> host of the slots ``job_id`` holds (a copy, in reservation order)."""
        return dict(self._held.get(job_id, {}))

    def held_view(self, job_id: str) -> Mapping[int, str]:
        """Task id -> host of the slots ``job_id`` holds, without a copy: read it now,
        do not keep it (a grow of thousands of tasks is checked against it)."""
        held = self._held.get(job_id)
        if isinstance(held, Unfolded):
            return held.unfold()
        return {} if held is None else held

    def as_held(self, job_id: str, tasks: Sequence[Task]) -> TaskList | None:
        """``tasks`` as the job's own task list, when they are exactly what it holds as
        runs (a shrink's commit of its first tasks, after its newest were freed), else
        ``None``. Compared in C, without making the job's task map; the list made is
        equal to ``tasks`` and reads its runs (the job's next shrink, its end and the
        checks count them a run at a time)."""
        placement = self._runs.get(job_id)
        if isinstance(tasks, TaskList) and tasks.placement is placement and not tasks.start:
            return tasks
        if placement is None or placement.runs is None or len(tasks) != placement.total:
            return None
        if (
            isinstance(tasks, TaskList)
            and not tasks.start
            and tasks.placement.names is placement.names
            and tasks.placement.runs == placement.runs
        ):
            # The job's list cut to its first tasks (the plugin's state after a release
            # of its newest ones): the same runs of the same hosts.
            return TaskList(placement)
        n = len(tasks)
        ids, hosts = list(map(_id_of, tasks)), list(map(_host_of, tasks))
        if ids == list(range(n)) and hosts == list(placement.task_hosts()):
            return TaskList(placement)
        return None

    def not_held(self, job_id: str, tasks: Sequence[Task]) -> Task | None:
        """The first of ``tasks`` that ``job_id`` does not hold on its host (``None``:
        it holds them all)."""
        held = self.held_view(job_id)
        for task in tasks:
            if held.get(task.id) != task.host:
                return task
        return None

    def held_count(self, job_id: str) -> int:
        return len(self._held.get(job_id, {}))

    def job_host_counts(self, job_id: str) -> dict[str, int]:
        """Slots ``job_id`` holds per host (a copy)."""
        return dict(self._job_hosts.get(job_id, {}))

    def job_hosts(self, job_id: str) -> Mapping[str, int]:
        """Slots ``job_id`` holds per host, without a copy: read it, do not keep it."""
        return self._job_hosts.get(job_id, {})

    def _use(self, host: str, n: int) -> int | None:
        """Add ``n`` to the slots in use on ``host``; return them, or ``None`` for a
        host the configuration no longer has (counted apart: it offers no slots)."""
        i = self._pos.get(host)
        if i is None:
            self._used_elsewhere[host] = self._used_elsewhere.get(host, 0) + n
            return None
        used = self._used[i] = self._used[i] + n
        return used

    def used(self, host: str) -> int:
        """Slots in use on ``host`` (also on a host the configuration no longer has)."""
        i = self._pos.get(host)
        return self._used_elsewhere.get(host, 0) if i is None else self._used[i]

    def free_slots(self) -> dict[str, int]:
        """Free slots per host, in host order (never negative; a copy, O(hosts))."""
        return self._free.as_dict()

    def free_counts(self) -> FreeSlots:
        """The free slots as the scheduler reads them (see :mod:`.slots`), without a
        copy: read it (or a draft of it) now, do not change it."""
        return self._free

    def free_on(self, host: str) -> int:
        """Free slots on ``host`` (0 for a host the cluster does not have)."""
        return self._free.free(host)

    def open_slots(self) -> Iterator[tuple[str, int]]:
        """``(host, free)`` of the hosts that have free slots, in host order; lazy."""
        return self._free.open_hosts()

    @property
    def free_total(self) -> int:
        return self._free.total

    def user_used(self, user: str) -> int:
        return self._user_used.get(user, 0)

    def users_in_use(self) -> dict[str, int]:
        return {u: n for u, n in self._user_used.items() if n}

    def headroom(self, user: str) -> int | None:
        """Slots ``user`` may still take: limit minus held (``None`` without a limit)."""
        limit = self._limits.get(user)
        if limit is None:
            return None
        return max(0, limit - self._user_used.get(user, 0))

    def check(self) -> list[str]:
        """Problems of the ledger itself: hosts over their slots, users over limits,
        counters that disagree with the held slots."""
        problems: list[str] = []
        recount: dict[str, int] = dict.fromkeys(self._slots, 0)
        user_recount: dict[str, int] = {}
        for job_id, held in self._held.items():
            per_host: dict[str, int] = {}
            for host in held.values():
                recount[host] = recount.get(host, 0) + 1
                per_host[host] = per_host.get(host, 0) + 1
            if per_host != self._job_hosts.get(job_id, {}):
                problems.append(f"job {job_id}: per-host counters disagree with its slots")
            if held:
                user = self._owner[job_id]
                user_recount[user] = user_recount.get(user, 0) + len(held)
        for host, n in recount.items():
            slots = self._slots.get(host)
            if slots is None:
                problems.append(f"host {host}: {n} slot(s) held on an unknown host")
            elif n > slots:
                problems.append(f"host {host}: {n} slots in use, only {slots}")
            if n != self.used(host):
                problems.append(f"host {host}: usage counter {self.used(host)} != {n}")
        for user in set(user_recount) | set(self._user_used):
            n = user_recount.get(user, 0)
            if n != self._user_used.get(user, 0):
                problems.append(f"user {user}: usage counter {self._user_used.get(user)} != {n}")
            limit = self._limits.get(user)
            if limit is not None and n > limit:
                problems.append(f"user {user}: {n} slots in use, limit {limit}")
        for host, slots in self._slots.items():
            want = max(0, slots - recount.get(host, 0)) if self._free.enabled(host) else 0
            if self._free.free(host) != want:
                problems.append(f"host {host}: free slot counter disagrees with the held slots")
        problems.extend(self._free.problems())
        return problems


_id_of = attrgetter("id")
_host_of = attrgetter("host")


def _task_hosts(placement: Placement) -> dict[int, str]:
    """Task id -> host of a job started with ``placement`` (tasks 0..n-1 in order)."""
    return dict(enumerate(placement.task_hosts()))
