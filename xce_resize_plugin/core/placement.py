"""Grow placement under span constraints, over an indexed free-slot view (docs/architecture.md).

One scheduler cycle builds a :class:`FreeSlotIndex` from the host's free-slot mapping.
For each pending grow the plugin wraps it in a :class:`GrowHostView` (the index plus
the job's tasks per host), asks the ``xce_resize_order_grow_hosts`` policy for an order
(:func:`default_grow_order` is the built-in one), lets :func:`place` pick slots
greedily along that order under the hard constraints, and, once the engine has decided
to reserve them, :func:`apply` takes them from the index so the next grow of the same
cycle sees what is left.

Everything here is pure: no I/O, no clock, no module state, and the same inputs always
give the same placement. Host-name ties are broken by Python's string order (code
points), never by hash or insertion accidents.

Cost model: building the index is one pass over the hosts (no sort), or over the hosts
with free slots only when the host's mapping is a :class:`SparseFree`; the "most free
first, then name" order is walked lazily bucket by bucket (a bucket is sorted the first
time a walk reaches it), so a grow that needs two hosts looks at two hosts, not at
10,000; a :meth:`FreeSlotIndex.take` is a bisection plus a list insert/delete within one
bucket.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence

from attrs import frozen

from xce_resize_plugin.core.models import GrowHosts, JobInfo

__all__ = [
    "FreeSlotIndex",
    "GrowHostView",
    "Placement",
    "SparseFree",
    "apply",
    "default_grow_order",
    "has_free",
    "place",
]


class SparseFree(Mapping[str, int]):
    """A cycle's free slots per host (every host, in the cluster's host order) that can
    also list only the hosts with free slots, and give its host order without a copy.

    A host of many hosts may return one from ``ClusterView.free_slots``: the plugin then
    builds its index from the hosts with free slots only, instead of every host at
    every cycle with a grow pending (docs/host-integration.md). It must read as the
    plain mapping it stands for: :meth:`open_items` is its items with a value above 0,
    in order, and :meth:`host_order` its keys.
    """

    __slots__ = ()

    def open_items(self) -> Iterable[tuple[str, int]]:
        """``(host, free)`` of the hosts with free slots, in host order."""
        return ((h, n) for h, n in self.items() if n > 0)

    def host_order(self) -> Sequence[str]:
        """Every host, in host order."""
        return tuple(self)


def has_free(free: Mapping[str, int]) -> bool:
    """Whether any host has a free slot (``any(free.values())``)."""
    if isinstance(free, SparseFree):
        return next(iter(free.open_items()), None) is not None
    return any(free.values())


class FreeSlotIndex:
    """The scheduler cycle's free slots per host, indexed for "most free first, then name".

    Built once per cycle from ``Mapping[str, int]`` (host -> free slots, in the
    cluster's host order). Hosts with 0 free slots are kept (:meth:`free` answers 0,
    :meth:`hosts` lists them) but :meth:`by_free_desc` never yields them.

    Internally hosts with free slots sit in one bucket per free count; the distinct
    counts are kept in a sorted list. Buckets start in cluster order and are sorted by
    name the first time a walk reaches them, so the build stays a single linear pass
    and a cycle only pays for sorting the buckets it actually visits.
    """

    __slots__ = (
        "_buckets",
        "_counts",
        "_free",
        "_hosts",
        "_known",
        "_log",
        "_n_free_hosts",
        "_unsorted",
    )

    def __init__(self, free: Mapping[str, int]) -> None:
        if isinstance(free, SparseFree):
            # Only the hosts with free slots are kept: the others answer 0 as a host of
            # 0 free slots does, and are listed from the host's own order.
            self._free: dict[str, int] = dict(free.open_items())
            self._hosts: Sequence[str] = free.host_order()
            #: Answers whether a host is one of the cycle's (the free ones are in _free).
            self._known: Mapping[str, int] = free
        else:
            self._free = dict(free)
            self._hosts = tuple(self._free)
            self._known = self._free
        if self._free and min(self._free.values()) < 0:
            bad = next(h for h, n in self._free.items() if n < 0)
            raise ValueError(f"negative free slots for host {bad!r}: {self._free[bad]}")
        grouped: defaultdict[int, list[str]] = defaultdict(list)
        for host, n in self._free.items():
            if n:
                grouped[n].append(host)
        self._buckets: dict[int, list[str]] = dict(grouped)
        self._counts: list[int] = sorted(self._buckets)
        # Buckets whose list is still in cluster order; sorted lazily by a walk.
        self._unsorted: set[int] = set(self._buckets)
        # Every take as (host, free before). A walk created at log length v can rebuild
        # the state it started from, which is what makes by_free_desc() a snapshot.
        self._log: list[tuple[str, int]] = []
        self._n_free_hosts = sum(len(b) for b in self._buckets.values())

    def __repr__(self) -> str:
        return f"FreeSlotIndex(hosts={len(self._hosts)}, hosts_with_free={self._n_free_hosts})"

    def free(self, host: str) -> int:
        """Free slots on ``host`` now; 0 for a host the cycle does not know."""
        return self._free.get(host, 0)

    def __contains__(self, host: object) -> bool:
        """Whether ``host`` is one of the cycle's hosts, free or not."""
        return host in self._free or host in self._known

    def hosts(self) -> Sequence[str]:
        """Every host of the cycle, free or not, in the cluster's host order."""
        return self._hosts

    def take(self, host: str, n: int) -> None:
        """Take ``n`` free slots on ``host``.

        Raises :class:`ValueError` when ``n`` is negative or more than :meth:`free`
        answers (an unknown host has 0). Taking 0 slots changes nothing.
        """
        if n < 0:
            raise ValueError(f"cannot take a negative number of slots ({n}) on {host!r}")
        old = self._free.get(host, 0)
        if n > old:
            raise ValueError(f"cannot take {n} slots on {host!r}: {old} free")
        if n == 0:
            return
        new = old - n
        self._free[host] = new
        self._log.append((host, old))
        self._bucket_remove(old, host)
        if new:
            self._bucket_add(new, host)
        else:
            self._n_free_hosts -= 1

    def take_many(self, takes: Iterable[tuple[str, int]]) -> None:
        """:meth:`take` of each ``(host, n)`` in turn, each bucket a host leaves
        rewritten once for all of them: a grow of many hosts took each out of a bucket
        of every open host one by one (a list delete each, O(hosts) per host). The same
        result as the takes one by one (the walks see the same; errors are theirs)."""
        items = list(takes)
        free = self._free
        hosts = [h for h, _ in items]
        if len(set(hosts)) != len(hosts) or any(n < 0 or n > free.get(h, 0) for h, n in items):
            for host, n in items:  # repeats or an error: the takes one by one
                self.take(host, n)
            return
        leaving: dict[int, set[str]] = {}
        arriving: list[tuple[int, str]] = []
        for host, n in items:
            if n == 0:
                continue
            old = free[host]
            new = old - n
            free[host] = new
            self._log.append((host, old))
            leaving.setdefault(old, set()).add(host)
            if new:
                arriving.append((new, host))
            else:
                self._n_free_hosts -= 1
        for count, gone in leaving.items():
            bucket = self._buckets[count]
            if len(gone) == len(bucket):
                del self._buckets[count]
                del self._counts[bisect_left(self._counts, count)]
                self._unsorted.discard(count)
            else:
                bucket[:] = [h for h in bucket if h not in gone]  # (order kept)
        for count, host in arriving:
            self._bucket_add(count, host)

    def by_free_desc(self) -> Iterator[str]:
        """Hosts with free slots, most free first, ties by name ascending; lazy.

        Guarantee: the iterator yields the order as it was when ``by_free_desc()`` was
        called — a snapshot — even if :meth:`take` runs while it is being consumed or
        before it is first read. As long as no take happens, it reads the live buckets
        directly (no copy); after a take it rebuilds the remaining snapshot buckets from
        the live ones and the take log, one bucket at a time.
        """
        # The version is captured here, not in the generator body, which would only
        # run at the first next() — after any take() made in between.
        return self._walk(len(self._log))

    # -- internals -----------------------------------------------------------------

    def _bucket_remove(self, count: int, host: str) -> None:
        bucket = self._buckets[count]
        if len(bucket) == 1:
            del self._buckets[count]
            del self._counts[bisect_left(self._counts, count)]
            self._unsorted.discard(count)
        elif count in self._unsorted:
            bucket.remove(host)
        else:
            del bucket[bisect_left(bucket, host)]

    def _bucket_add(self, count: int, host: str) -> None:
        bucket = self._buckets.get(count)
        if bucket is None:
            self._buckets[count] = [host]
            insort(self._counts, count)
        elif count in self._unsorted:
            bucket.append(host)
        else:
            insort(bucket, host)

    def _walk(self, version: int) -> Iterator[str]:
        counts, buckets, log = self._counts, self._buckets, self._log
        current: int | None = None  # the bucket being yielded
        after: str | None = None  # the last host yielded from it
        # Fast path: nothing was taken since the snapshot, read the live buckets. Every
        # check sits right before a read, so a take between two next() calls is seen.
        while len(log) == version:
            i = (len(counts) if current is None else bisect_left(counts, current)) - 1
            if i < 0:
                return
            current = counts[i]
            after = None
            bucket = buckets[current]
            if current in self._unsorted:
                bucket.sort()  # same members, so other walks and take() are unaffected
                self._unsorted.discard(current)
            j = 0
            while j < len(bucket) and len(log) == version:
                after = bucket[j]
                j += 1
                yield after
        # Slow path: the index changed. A host not taken since the snapshot still has its
        # snapshot free count, so snapshot bucket c = live bucket c minus taken hosts,
        # plus the taken hosts whose first logged "free before" is c.
        before: dict[str, int] = {}
        synced = version
        while True:
            for host, old in log[synced:]:
                before.setdefault(host, old)
            synced = len(log)
            if current is not None:
                snap = [h for h in buckets.get(current, ()) if h not in before]
                snap.extend(h for h, old in before.items() if old == current)
                snap.sort()
                start = 0 if after is None else bisect_right(snap, after)
                # The snapshot bucket is final, so later takes cannot disturb this.
                yield from snap[start:]
                for host, old in log[synced:]:
                    before.setdefault(host, old)
                synced = len(log)
            i = (len(counts) if current is None else bisect_left(counts, current)) - 1
            below = [old for old in before.values() if current is None or old < current]
            if i >= 0:
                below.append(counts[i])
            if not below:
                return
            current = max(below)
            after = None


class GrowHostView:
    """What the order policy hook sees for one job: the cycle's free slots plus the job's tasks.

    Read-only: a policy can look, it cannot take slots. Iterating gives every host of
    the cycle in cluster order; ``len()`` counts them; ``host in view`` is O(1).
    """

    __slots__ = ("_index", "_job_tasks")

    def __init__(self, index: FreeSlotIndex, job_tasks: Mapping[str, int]) -> None:
        """``job_tasks``: host -> tasks of the job there, in allocation order.

        Hosts with 0 tasks are dropped; a negative count is a :class:`ValueError`.
        """
        self._index = index
        tasks: dict[str, int] = {}
        for host, n in job_tasks.items():
            if n < 0:
                raise ValueError(f"negative task count for host {host!r}: {n}")
            if n:
                tasks[host] = n
        self._job_tasks = tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self._index.hosts())

    def __len__(self) -> int:
        return len(self._index.hosts())

    def __contains__(self, host: object) -> bool:
        return host in self._index

    def __repr__(self) -> str:
        return f"GrowHostView({self._index!r}, job_hosts={len(self._job_tasks)})"

    def free(self, host: str) -> int:
        """Free slots on ``host`` this cycle (after grows placed earlier in the cycle)."""
        return self._index.free(host)

    def job_tasks(self, host: str) -> int:
        """The job's tasks on ``host`` (0 when it has none there)."""
        return self._job_tasks.get(host, 0)

    def job_hosts(self) -> Sequence[str]:
        """Hosts holding the job's tasks, in allocation order (first execution host first)."""
        return tuple(self._job_tasks)

    def by_free_desc(self) -> Iterator[str]:
        """Hosts with free slots, most free first, then name; lazy snapshot.

        See :meth:`FreeSlotIndex.by_free_desc`.
        """
        return self._index.by_free_desc()


def default_grow_order(job: JobInfo, hosts: GrowHostView) -> Iterator[str]:
    """The built-in order in which a grow tries hosts; lazy.

    - ``prefer-existing``: the job's own hosts (allocation order) first, then the other
      hosts, most free slots first, then name;
    - ``new-only``: only hosts without the job's tasks, most free first, then name;
    - ``any``: every host, most free first, then name.

    Hosts without a free slot are left out. Nothing is materialised: a grow that needs
    two hosts reads about two hosts from the index.
    """
    mode = job.grow_hosts
    if mode is GrowHosts.ANY:
        yield from hosts.by_free_desc()
        return
    if mode is GrowHosts.PREFER_EXISTING:
        # Packing onto the job's hosts first keeps its span (and its network) small.
        for host in hosts.job_hosts():
            if hosts.free(host) > 0:
                yield host
    # The job's hosts were either offered above or are excluded (new-only).
    for host in hosts.by_free_desc():
        if not hosts.job_tasks(host):
            yield host


@frozen
class Placement:
    """Where a grow's new tasks go: ``(host, tasks added)`` in the order chosen."""

    hosts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        """The number of tasks placed."""
        return sum(n for _, n in self.hosts)


def place(
    order: Iterable[str],
    hosts: GrowHostView,
    *,
    min_add: int,
    max_add: int,
    ptile: int | None,
    grow_hosts: GrowHosts,
    headroom: int | None,
) -> Placement | None:
    """Place up to ``max_add`` new tasks greedily along ``order``; ``None`` below ``min_add``.

    :param order: host names, usually the policy's answer; duplicates and hosts the
        cycle does not know are ignored. Read lazily, and no further than needed.
    :param hosts: the cycle's free slots and the job's tasks per host.
    :param min_add: fewest tasks worth granting (>= 1).
    :param max_add: most tasks wanted (>= ``min_add``).
    :param ptile: most tasks of the job on one host, counting those it already has
        there; ``None`` for no limit.
    :param grow_hosts: ``new-only`` never uses a host already holding the job's tasks,
        whatever the order says.
    :param headroom: the user's remaining slot limit (``None``: unlimited); caps the
        total.

    Each host takes ``min(free, ptile - job's tasks there, still wanted)``. Reading
    stops as soon as ``max_add`` (or the headroom) is reached, or once every host with
    free slots has been seen (so an endless policy iterator cannot hang the scheduler).
    Returns ``None`` — nothing reserved — when fewer than ``min_add`` fit. The index is
    not modified; see :func:`apply`.
    """
    if min_add < 1:
        raise ValueError(f"min_add must be at least 1, got {min_add}")
    if max_add < min_add:
        raise ValueError(f"max_add ({max_add}) is less than min_add ({min_add})")
    if ptile is not None and ptile < 1:
        raise ValueError(f"ptile must be at least 1, got {ptile}")
    if headroom is not None and headroom < 0:
        raise ValueError(f"headroom must not be negative, got {headroom}")
    wanted = max_add if headroom is None else min(max_add, headroom)
    if wanted < min_add:
        # The limit alone rules the grow out: do not even ask the order for hosts.
        return None
    new_only = grow_hosts is GrowHosts.NEW_ONLY
    index = hosts._index
    free_of = index._free.get
    job_tasks_of = hosts._job_tasks.get
    useful_hosts = index._n_free_hosts
    remaining = wanted
    chosen: list[tuple[str, int]] = []
    seen: set[str] = set()
    if not useful_hosts:
        return None  # min_add >= 1 cannot fit on a full cluster; spare reading the order
    for host in order:
        if host in seen:
            continue
        free = free_of(host, 0)
        if free <= 0:
            continue  # unknown or full: it does not count towards useful_hosts
        seen.add(host)
        existing = job_tasks_of(host, 0)
        if new_only and existing:
            continue
        room = free if ptile is None else min(free, ptile - existing)
        if room > 0:
            n = min(room, remaining)
            chosen.append((host, n))
            remaining -= n
            if not remaining:
                break
        if len(seen) >= useful_hosts:
            break  # every host with free slots was considered: nothing more can come
    if wanted - remaining < min_add:
        return None
    return Placement(tuple(chosen))


def apply(index: FreeSlotIndex, placement: Placement) -> None:
    """Take a placement's slots from the index: all of them, or none.

    Raises :class:`ValueError` (and takes nothing) when a host has fewer free slots
    than the placement puts there, e.g. a placement from an earlier state.
    """
    need: dict[str, int] = {}
    for host, n in placement.hosts:
        if n < 1:
            raise ValueError(f"placement puts {n} tasks on {host!r}")
        need[host] = need.get(host, 0) + n
    for host, n in need.items():
        if n > index.free(host):
            raise ValueError(f"placement needs {n} slots on {host!r}: {index.free(host)} free")
    index.take_many(need.items())
