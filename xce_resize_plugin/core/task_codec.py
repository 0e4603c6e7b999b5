"""How the journal writes an allocation (a job's tasks), and reads it back.

Small allocations are ``[id, host]`` pairs. A long one (:data:`RUN_MIN` tasks or more)
is its hosts with its first id (ids that follow one another, schema 4) or with a few
stretches of ids (schema 5), and in its hosts a stretch of consecutively numbered
names is one run (schema 5). docs/journal-format.md states the forms; the converters
(core/converters.py) register these functions for every field of tasks.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, Generic, TypeVar

import orjson

from xce_resize_plugin.core.allocations import id_range
from xce_resize_plugin.core.models import Task, TasksInIdOrder, make_tasks

_id_and_host = attrgetter("id", "host")

#: An allocation of at least this many tasks whose ids follow one another is written as
#: its first id and its hosts (schema 4, docs/journal-format.md), not as pairs: a job of
#: many hosts has each new allocation encoded, and the pairs were most of the cost.
#: Smaller ones keep the pairs (and the bytes they always had).
RUN_MIN = 256

#: A stretch of at least this many hosts named by consecutive numbers (``n0041``,
#: ``n0042``, …) is written as one run in the ``hosts`` of that form (schema 5): a job of
#: tens of thousands of one-slot hosts has its records written in a few bytes, not as
#: every host's name (docs/journal-format.md).
HOST_RUN_MIN = 4
#: The most hosts one run or one allocation may stand for when read: a damaged or
#: hostile record cannot make the reader build a list without end.
HOSTS_MAX = 1 << 24
#: The widest zero-padded number in a run (wider ones are written as names).
DIGITS_MAX = 18
#: The longest prefix of a run (a host name is at most 255 characters,
#: core/releasespec.py): a run cannot stand for names longer than any host's.
PREFIX_MAX = 255

#: A host's name as a prefix and a number at its end (ASCII digits only, so that the
#: number written back gives the same name).
_NUMBERED = re.compile(r"(.*?)([0-9]+)", re.ASCII | re.DOTALL)

#: How many sequences of names (clusters' hosts) :meth:`HostNumbers.codes_of` keeps.
SEQUENCES_KEPT = 4

#: The number's bits in a host name's int (:class:`HostNumbers`).
_NUMBER_BITS = (1 << 64) - 1

T = TypeVar("T")

HostItem = str | list[str | int]
EncodedTasks = list[tuple[int, str]] | dict[str, int | list[HostItem] | list[list[int]]]


class HostNumbers(dict[str, int | None]):
    """Each host name seen, as an int that counts up with the number at the name's end:
    ``kind << 64 | number``, where ``kind`` stands for the name's prefix and how many
    digits its number has (``n0099`` and ``n1000`` are of one kind, zero-padded to 4;
    ``n9`` and ``n10`` are not). Names of one kind with consecutive numbers are
    consecutive ints, so runs are found by comparing ints in C (:func:`_id_run`); a
    name without a number is ``None``.

    A cluster's names are few and come back in every allocation: each is parsed once.
    Bounded: past ``names`` names (262,144 by default, some 40 MB at most; CEA Curie's
    93,312 hosts fit) new ones are parsed each time and not kept, and past
    ``kinds`` kinds a new kind's names are written as names (``None``). Kinds are never
    renumbered, so concurrent encoders agree.
    """

    def __init__(self, names: int = 1 << 18, kinds: int = 4096) -> None:
        super().__init__()
        self._names, self._kinds = names, kinds
        self._kind_of: dict[tuple[str, int], int] = {}
        self._spelling: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        #: The ints of whole sequences of names (a cluster's hosts), by identity: the
        #: last :data:`SEQUENCES_KEPT` read, each kept alive with its ints (``None``:
        #: the kinds ran out, see :meth:`codes_of`).
        self._sequences: dict[int, tuple[Sequence[str], list[int | None] | None]] = {}

    def __missing__(self, name: str) -> int | None:
        m = _NUMBERED.fullmatch(name)
        code: int | None = None
        if m is not None and len(m[2]) <= DIGITS_MAX and len(m[1]) <= PREFIX_MAX:
            digits = m[2]
            key = (m[1], len(digits))
            with self._lock:
                kind = self._kind_of.get(key)
                if kind is None and len(self._spelling) < self._kinds:
                    kind = self._kind_of[key] = len(self._spelling)
                    self._spelling.append(key)
            if kind is not None:
                code = kind << 64 | int(digits)
        if len(self) < self._names:
            self[name] = code
        return code

    def codes_of(self, names: Sequence[str]) -> list[int | None] | None:
        """The int of each of ``names``, read once per sequence: a host's list gives
        its tasks' hosts as runs of its cluster's names (``TasksInIdOrder``'s
        ``host_positions``), and a job of thousands of hosts then costs no look-up
        per host. ``None`` once the kinds ran out: which names then get a kind depends
        on the order they are met, so they are met one by one, as before."""
        key = id(names)
        kept = self._sequences.get(key)
        if kept is not None and kept[0] is names:
            return kept[1]
        codes: list[int | None] | None = list(map(self.__getitem__, names))
        if len(self._spelling) >= self._kinds:
            codes = None  # kept too: kinds are never freed, so it stays so
        with self._lock:
            sequences = self._sequences
            while len(sequences) >= SEQUENCES_KEPT:
                del sequences[next(iter(sequences))]
            sequences[key] = (names, codes)
        return codes

    def spelling(self, code: int) -> tuple[str, int, int]:
        """``(prefix, number, digits)`` of a name's int."""
        prefix, width = self._spelling[code >> 64]
        return prefix, code & _NUMBER_BITS, width


def host_runs(
    hosts: list[str], numbers: HostNumbers, codes: list[int | None] | None = None
) -> list[HostItem]:
    """``hosts`` with each stretch of :data:`HOST_RUN_MIN` or more names numbered one
    after another written as ``[prefix, first number, count, digits]``; the others as
    they are. Exact by construction: a name's int stands for that name only, and a run
    for the names its ints stand for. ``codes``: the hosts' ints, if already known
    (:meth:`HostNumbers.codes_of`)."""
    if codes is None:
        codes = list(map(numbers.__getitem__, hosts))
    out: list[HostItem] = []
    i, n = 0, len(hosts)
    while i < n:
        code = codes[i]
        if code is None:
            out.append(hosts[i])
            i += 1
            continue
        k = _id_run(codes, i)  # type: ignore[arg-type]  # a None ends a run (never equal)
        if k >= HOST_RUN_MIN:
            prefix, number, digits = numbers.spelling(code)
            out.append([prefix, number, k, digits])
        else:
            out.extend(hosts[i : i + k])
        i += k
    return out


def hosts_of(items: list[Any]) -> list[str]:
    """The names that :func:`host_runs`' items stand for; ``ValueError`` naming the
    first item that is neither a name nor a well-formed run."""
    hosts: list[str] = []
    for item in items:
        if type(item) is str:
            hosts.append(item)
            continue
        if not (
            type(item) is list
            and len(item) == 4
            and type(item[0]) is str
            and len(item[0]) <= PREFIX_MAX
            and all(type(x) is int for x in item[1:])
            and 0 <= item[1] < 10**DIGITS_MAX
            and 1 <= item[2] <= HOSTS_MAX - len(hosts)
            and 1 <= item[3] <= DIGITS_MAX
        ):
            raise ValueError(
                f"tasks: expected a host name or [prefix, number, count, digits] "
                f"(at most {HOSTS_MAX} hosts), got {item!r:.80}"
            )
        prefix, first, count, digits = item
        hosts.extend([f"{prefix}{v:0{digits}d}" for v in range(first, first + count)])
    if len(hosts) > HOSTS_MAX:
        raise ValueError(f"tasks: {len(hosts)} hosts, at most {HOSTS_MAX} are read")
    return hosts


def _each_times(items: Sequence[T], take: int) -> Iterable[T]:
    """Each of ``items``, ``take`` times in a row."""
    if take == 1:
        return items
    return chain.from_iterable(map(repeat, items, repeat(take, len(items))))


def _list_host_runs(tasks: TasksInIdOrder, numbers: HostNumbers) -> list[HostItem]:
    """:func:`host_runs` of a host's list: from its runs of its cluster's names when it
    has them (each name's int read once per cluster, not once per task), else from its
    tasks' hosts. The same items either way (tested)."""
    positions = tasks.host_positions()
    if positions is not None:
        names, runs = positions
        all_codes = numbers.codes_of(names)
        if all_codes is not None:
            hosts: list[str] = []
            codes: list[int | None] = []
            for first, n, take in runs:
                hosts += _each_times(names[first : first + n], take)
                codes += _each_times(all_codes[first : first + n], take)
            return host_runs(hosts, numbers, codes)
    return host_runs(list(tasks.task_hosts()), numbers)


#: At most one stretch of consecutive ids per this many tasks for the ``ids`` form: an
#: allocation cut into more pieces than that is written as pairs.
STRETCH_EVERY = 16


def _id_run(ids: list[int], i: int) -> int:
    """How many ids from ``ids[i]`` on count up by one: the next one first, then in
    chunks that double, each compared with a range in C."""
    n, first = len(ids), ids[i]
    if i + 1 == n or ids[i + 1] != first + 1:
        return 1
    k, step = 2, 8
    while i + k < n:
        m = min(step, n - i - k)
        chunk = ids[i + k : i + k + m]
        if chunk == list(range(first + k, first + k + m)):
            k += m
            step *= 2
            continue
        for have in chunk:
            if have != first + k:
                break
            k += 1
        return k
    return k


def _id_stretches(ids: list[int]) -> list[list[int]] | None:
    """``ids`` as ``[first, count]`` stretches of consecutive ids, in order; ``None``
    when there are more than one per :data:`STRETCH_EVERY` ids."""
    out: list[list[int]] = []
    limit = len(ids) // STRETCH_EVERY
    i, n = 0, len(ids)
    while i < n:
        k = _id_run(ids, i)
        out.append([ids[i], k])
        if len(out) > limit:
            return None
        i += k
    return out


def encode_tasks(tasks: Sequence[Task], numbers: HostNumbers) -> EncodedTasks:
    """``[id, host]`` pairs (as tuples: JSON writes them as the same arrays), made in C
    in one pass; or, for a long allocation, its hosts (with runs of numbered hosts,
    :func:`host_runs`) and its ids: ``{"first": id, "hosts": [...]}`` when they follow
    one another (schema 4), ``{"ids": [[first, count], ...], "hosts": [...]}`` when
    they are a few such stretches (schema 5: a job grown and shrunk keeps gaps in its
    ids). Which form depends only on the tasks, not on the sequence that holds them: a
    host's list in id order gives its ids' range and hosts itself."""
    n = len(tasks)
    if isinstance(tasks, TasksInIdOrder):
        span = id_range(tasks) if n >= RUN_MIN else None
        if span is not None:
            return {"first": span.start, "hosts": _list_host_runs(tasks, numbers)}
        # A host's list may make the pairs without making its tasks.
        pairs: list[tuple[int, str]] = list(tasks.id_host_pairs())
    else:
        pairs = list(map(_id_and_host, tasks))
    if n < RUN_MIN:
        return pairs
    ids, hosts = (list(column) for column in zip(*pairs, strict=True))
    stretches = _id_stretches(ids) if type(ids[0]) is int else None
    if stretches is None:
        return pairs
    runs = host_runs(hosts, numbers)
    if len(stretches) == 1:
        return {"first": stretches[0][0], "hosts": runs}
    return {"ids": stretches, "hosts": runs}


def _ids_of(stretches: Any) -> list[int]:
    """The ids that ``[first, count]`` stretches stand for; ``ValueError`` naming the
    first malformed one."""
    if type(stretches) is not list:
        raise ValueError(f"tasks: expected ids as [[first, count], ...], got {stretches!r:.80}")
    ids: list[int] = []
    for item in stretches:
        if not (
            type(item) is list
            and len(item) == 2
            and type(item[0]) is int
            and type(item[1]) is int
            and 1 <= item[1] <= HOSTS_MAX - len(ids)
        ):
            raise ValueError(
                f"tasks: expected [first, count] (at most {HOSTS_MAX} ids), got {item!r:.80}"
            )
        ids.extend(range(item[0], item[0] + item[1]))
    return ids


def decode_tasks(value: Any, _: Any) -> tuple[Task, ...]:
    """Any form :func:`encode_tasks` writes (pairs: every schema; ``first`` with
    names only: schema 4)."""
    if isinstance(value, dict):
        items = value.get("hosts")
        if type(items) is not list:
            raise ValueError(f"tasks: expected hosts as a list, got {value!r:.80}")
        keys = value.keys()
        if keys == {"first", "hosts"} and type(value["first"]) is int:
            hosts = hosts_of(items)
            return make_tasks(range(value["first"], value["first"] + len(hosts)), hosts)
        if keys == {"ids", "hosts"}:
            ids, hosts = _ids_of(value["ids"]), hosts_of(items)
            if len(ids) != len(hosts):
                raise ValueError(f"tasks: {len(ids)} ids for {len(hosts)} hosts")
            return make_tasks(ids, hosts)
        raise ValueError(
            f"tasks: expected {{'first': id, 'hosts': [...]}} or {{'ids': [...], 'hosts': "
            f"[...]}}, got {value!r:.80}"
        )
    return tuple([Task(int(i), str(h)) for i, h in value])


K = TypeVar("K")
V = TypeVar("V")


class TaskKeep(Generic[K, V]):
    """Values kept by key, each standing for some number of tasks: the oldest are
    dropped first once the kept values stand for more than ``budget`` tasks, and a
    value for more than that is not kept. Journals of several controllers may encode
    and decode at once in one process: writes hold a lock."""

    __slots__ = ("_lock", "budget", "items", "tasks")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        #: key -> (tasks, value), oldest first.
        self.items: dict[K, tuple[int, V]] = {}
        self.tasks = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        kept = self.items.get(key)
        return None if kept is None else kept[1]

    def put(self, key: K, value: V, tasks: int) -> None:
        if tasks > self.budget:
            return
        with self._lock:
            items = self.items
            while items and self.tasks + tasks > self.budget:
                self.tasks -= items.pop(next(iter(items)))[0]
            if key not in items:
                items[key] = (tasks, value)
                self.tasks += tasks


class DecodedTasks:
    """The journal's decoding of long allocations (the forms with ``hosts``), kept for
    the allocations decoded last, by their JSON.

    A job's resize records hold each allocation up to three times (a record's ``after``
    is the next one's ``before``), and replaying a job (``journal verify``, recovery)
    decodes its facts and its state: a job of tens of thousands of hosts had the same
    tasks made again for each. Equal JSON gives the same tuple, which is immutable;
    equal tuples then compare item by item by identity, in C. At most ``budget``
    tasks are kept (some 35 MB by default).
    """

    __slots__ = ("_keep",)

    def __init__(self, budget: int = 1 << 19) -> None:
        self._keep: TaskKeep[bytes, tuple[Task, ...]] = TaskKeep(budget)

    def __call__(self, value: Any, cl: Any) -> tuple[Task, ...]:
        if not isinstance(value, dict):
            return decode_tasks(value, cl)
        try:
            key = orjson.dumps(value)
        except TypeError:  # not JSON orjson writes (an int past 64 bits): decoded as is
            return decode_tasks(value, cl)
        kept = self._keep.get(key)
        if kept is not None:
            return kept
        tasks = decode_tasks(value, cl)
        self._keep.put(key, tasks, len(tasks))
        return tasks
