"""The cattrs converters: the journal's encoding and the JSON API's, kept apart from the
models (docs/architecture.md, "Models we follow").

Facts are encoded as compact JSON objects tagged with ``"type"`` (the class name), so
``journal export`` writes readable JSON lines and a newer fact type is recognisable.
Decoding rejects unknown keys; :func:`structure_or_error` turns cattrs' nested errors
into one ``InvalidRequest`` whose message lists each problem as ``… @ $.path``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from operator import attrgetter
from typing import Any, TypeVar

import cattrs
import orjson
from cattrs.gen import make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from xce_resize_plugin import errors
from xce_resize_plugin.core.accounting import Usage
from xce_resize_plugin.core.allocations import id_range
from xce_resize_plugin.core.models import (
    FACT_TYPES,
    AutoresizeRequest,
    Change,
    Fact,
    GrowRequest,
    GrowRequested,
    PendingGrow,
    ReleaseAccepted,
    ReleaseRequest,
    ResizeRecord,
    ResizeState,
    Target,
    TargetRequest,
    Task,
    TasksInIdOrder,
    TasksLost,
    TasksStopped,
    TaskStopped,
    host_counts,
    make_tasks,
)
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.journal import StoredState, Tail

T = TypeVar("T")


_id_and_host = attrgetter("id", "host")
_id_of = attrgetter("id")
_host_of = attrgetter("host")

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

HostItem = str | list[str | int]
EncodedTasks = list[tuple[int, str]] | dict[str, int | list[HostItem] | list[list[int]]]


class _HostNumbers(dict[str, int | None]):
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

    def spelling(self, code: int) -> tuple[str, int, int]:
        """``(prefix, number, digits)`` of a name's int."""
        prefix, width = self._spelling[code >> 64]
        return prefix, code & _NUMBER_BITS, width


_NUMBER_BITS = (1 << 64) - 1


def _host_runs(hosts: list[str], numbers: _HostNumbers) -> list[HostItem]:
    """``hosts`` with each stretch of :data:`HOST_RUN_MIN` or more names numbered one
    after another written as ``[prefix, first number, count, digits]``; the others as
    they are. Exact by construction: a name's int stands for that name only, and a run
    for the names its ints stand for."""
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


def _hosts_of(items: list[Any]) -> list[str]:
    """The names that :func:`_host_runs`' items stand for; ``ValueError`` naming the
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


def _unstructure_tasks(tasks: Sequence[Task], numbers: _HostNumbers) -> EncodedTasks:
    """``[id, host]`` pairs (as tuples: JSON writes them as the same arrays), made in C
    in one pass; or, for a long allocation, its hosts (with runs of numbered hosts,
    :func:`_host_runs`) and its ids: ``{"first": id, "hosts": [...]}`` when they follow
    one another (schema 4), ``{"ids": [[first, count], ...], "hosts": [...]}`` when
    they are a few such stretches (schema 5: a job grown and shrunk keeps gaps in its
    ids). Which form depends only on the tasks, not on the sequence that holds them: a
    host's list in id order gives its ids' range and hosts itself."""
    n = len(tasks)
    if isinstance(tasks, TasksInIdOrder):
        span = id_range(tasks) if n >= RUN_MIN else None
        if span is not None:
            return {"first": span.start, "hosts": _host_runs(list(tasks.task_hosts()), numbers)}
        pairs = tasks.id_host_pairs  # a host's list may make them without its tasks
    else:
        pairs = partial(map, _id_and_host, tasks)
    if n < RUN_MIN:
        return list(pairs())
    ids = list(map(_id_of, tasks))
    stretches = _id_stretches(ids) if type(ids[0]) is int else None
    if stretches is None:
        return list(pairs())
    hosts = _host_runs(list(map(_host_of, tasks)), numbers)
    if len(stretches) == 1:
        return {"first": stretches[0][0], "hosts": hosts}
    return {"ids": stretches, "hosts": hosts}


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


def _structure_tasks(value: Any, _: Any) -> tuple[Task, ...]:
    """Any form :func:`_unstructure_tasks` writes (pairs: every schema; ``first`` with
    names only: schema 4)."""
    if isinstance(value, dict):
        items = value.get("hosts")
        if type(items) is not list:
            raise ValueError(f"tasks: expected hosts as a list, got {value!r:.80}")
        keys = value.keys()
        if keys == {"first", "hosts"} and type(value["first"]) is int:
            hosts = _hosts_of(items)
            return make_tasks(range(value["first"], value["first"] + len(hosts)), hosts)
        if keys == {"ids", "hosts"}:
            ids, hosts = _ids_of(value["ids"]), _hosts_of(items)
            if len(ids) != len(hosts):
                raise ValueError(f"tasks: {len(ids)} ids for {len(hosts)} hosts")
            return make_tasks(ids, hosts)
        raise ValueError(
            f"tasks: expected {{'first': id, 'hosts': [...]}} or {{'ids': [...], 'hosts': "
            f"[...]}}, got {value!r:.80}"
        )
    return tuple([Task(int(i), str(h)) for i, h in value])


class _DecodedTasks:
    """The journal's decoding of long allocations (the forms with ``hosts``), kept for
    the allocations decoded last, by their JSON.

    A job's resize records hold each allocation up to three times (a record's ``after``
    is the next one's ``before``), and replaying a job (``journal verify``, recovery)
    decodes its facts and its state: a job of tens of thousands of hosts had the same
    tasks made again for each. Equal JSON gives the same tuple, which is immutable;
    equal tuples then compare item by item by identity, in C. The oldest are dropped
    first once the kept tuples hold more than ``budget`` tasks (some 35 MB at most).
    """

    __slots__ = ("_budget", "_kept", "_lock", "_tasks")

    def __init__(self, budget: int = 1 << 19) -> None:
        self._budget = budget
        self._kept: dict[bytes, tuple[Task, ...]] = {}
        self._tasks = 0
        self._lock = threading.Lock()

    def __call__(self, value: Any, cl: Any) -> tuple[Task, ...]:
        if not isinstance(value, dict):
            return _structure_tasks(value, cl)
        try:
            key = orjson.dumps(value)
        except TypeError:  # not JSON orjson writes (an int past 64 bits): decoded as is
            return _structure_tasks(value, cl)
        kept = self._kept.get(key)
        if kept is not None:
            return kept
        tasks = _structure_tasks(value, cl)
        n = len(tasks)
        if n <= self._budget:
            with self._lock:
                kept_now = self._kept
                while kept_now and self._tasks + n > self._budget:
                    self._tasks -= len(kept_now.pop(next(iter(kept_now))))
                if key not in kept_now:
                    kept_now[key] = tasks
                    self._tasks += n
        return tasks


class _EncodedTasks:
    """The journal's encoding of task tuples, kept for the tuples last encoded.

    A job's allocation is the same tuple from one transition to the next until a
    resize commits, and a resize record's allocations are the tuples its states held:
    a job of many hosts would have the same tens of thousands of pairs encoded again
    at every transition. The bytes depend only on the tuple's contents (tuples do not
    change), and a kept tuple stays referenced, so its ``id`` is not reused while
    kept. Small tuples are encoded each time (cheaper than the look-up). The oldest
    are dropped first once the kept tuples hold more than ``budget`` tasks.
    """

    __slots__ = ("_budget", "_kept", "_lock", "_numbers", "_small", "_tasks")

    def __init__(self, budget: int = 1 << 18, small: int = 256) -> None:
        #: The host names seen, parsed once (runs of numbered hosts, schema 5).
        self._numbers = _HostNumbers()
        #: Tasks kept in all. A kept tuple stays alive with its tasks: by default some
        #: 30 MB at most with the bytes; a larger budget gained nothing measurable on a
        #: 65,536-host workload and cost 160 MB more (docs/performance.md).
        self._budget = budget
        #: Tuples shorter than this are not kept: most jobs, with nothing to gain.
        self._small = small
        self._kept: dict[int, tuple[Sequence[Task], orjson.Fragment]] = {}
        self._tasks = 0
        # Journals of several controllers may encode at once in one process.
        self._lock = threading.Lock()

    def __call__(self, tasks: Sequence[Task]) -> EncodedTasks | orjson.Fragment:
        n = len(tasks)
        if n < self._small:
            return _unstructure_tasks(tasks, self._numbers)
        kept = self._kept.get(id(tasks))
        if kept is not None and kept[0] is tasks:
            return kept[1]
        encoded = orjson.Fragment(_dumps(_unstructure_tasks(tasks, self._numbers)))
        if n <= self._budget:
            with self._lock:
                kept_now = self._kept
                while kept_now and self._tasks + n > self._budget:
                    old, _ = kept_now.pop(next(iter(kept_now)))
                    self._tasks -= len(old)
                if id(tasks) not in kept_now:
                    kept_now[id(tasks)] = (tasks, encoded)
                    self._tasks += n
        return encoded


def _is_tasks(t: object) -> bool:
    """A field of tasks: a tuple, or an allocation that may be a host's own list
    (core/allocations.py)."""
    return t == tuple[Task, ...] or t == Sequence[Task]


def _make_journal_converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True)
    # Tasks are the bulk of every record: [id, host] instead of {"id":…, "host":…}, and
    # a long allocation of consecutive ids as its first id and hosts (RUN_MIN).
    conv.register_unstructure_hook(Task, lambda t: [t.id, t.host])
    conv.register_structure_hook(Task, lambda v, _: Task(int(v[0]), str(v[1])))
    # Recovery decodes every live job's state, and tasks are most of it: a direct hook
    # for task tuples is several times faster than cattrs' generic tuple path.
    conv.register_structure_hook_func(_is_tasks, _DecodedTasks())
    # And the other way round: a job's state, with its allocation, is encoded at every
    # transition; cattrs' generic path calls a hook per task through a generator.
    # Already encoded: the journal's converter is only ever read by orjson (_dumps).
    conv.register_unstructure_hook_func(_is_tasks, _EncodedTasks())
    # A record's reason is written only when there is one (an involuntary shrink), so
    # the records of requested changes keep the bytes they always had.
    conv.register_unstructure_hook(
        ResizeRecord,
        make_dict_unstructure_fn(ResizeRecord, conv, reason=override(omit_if_default=True)),
    )
    _omit_new_defaults(conv)
    configure_tagged_union(Fact, conv, tag_name="type")
    return conv


def _omit_new_defaults(conv: cattrs.Converter) -> None:
    """Fields added with readiness and release_exited (docs/in-job-api.md) are written
    only when they differ from their default: journals without them keep their bytes,
    and an older journal (which has none) reads as before."""
    omit = override(omit_if_default=True)
    conv.register_unstructure_hook(
        GrowRequested, make_dict_unstructure_fn(GrowRequested, conv, ready_timeout=omit)
    )
    conv.register_unstructure_hook(
        TasksLost, make_dict_unstructure_fn(TasksLost, conv, reason=omit)
    )
    conv.register_unstructure_hook(
        PendingGrow, make_dict_unstructure_fn(PendingGrow, conv, ready_timeout=omit)
    )
    # Drain fields likewise: the facts and states of changes without a drain keep
    # the bytes they always had.
    conv.register_unstructure_hook(
        ReleaseAccepted,
        make_dict_unstructure_fn(ReleaseAccepted, conv, grace=override(omit_if_default=True)),
    )
    conv.register_unstructure_hook(
        TaskStopped,
        make_dict_unstructure_fn(TaskStopped, conv, status=override(omit_if_default=True)),
    )
    conv.register_unstructure_hook(
        TasksStopped,
        make_dict_unstructure_fn(TasksStopped, conv, status=override(omit_if_default=True)),
    )
    conv.register_unstructure_hook(
        Change,
        make_dict_unstructure_fn(
            Change,
            conv,
            ready_by=omit,
            grace=override(omit_if_default=True),
            deadline=override(omit_if_default=True),
            drained=override(omit_if_default=True),
        ),
    )


def _strict(kind: type) -> Any:
    # cattrs would coerce "3" to 3, 2.5 to 2 and 1 to True; API input must say what it means.
    def check(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    return check


def _strict_number(value: Any, _: Any) -> float:
    # A JSON number (not a string, not true/false), finite.
    if type(value) not in (int, float) or not math.isfinite(value):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def _make_api_converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True)
    for kind in (int, str, bool):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_structure_hook(float, _strict_number)
    conv.register_unstructure_hook(Task, lambda t: {"id": t.id, "host": t.host})
    _register_answers(conv)
    return conv


def _register_answers(conv: cattrs.Converter) -> None:
    """The JSON answers of the REST API (docs/rest-api.md): a job's resize status, its
    history and resize records. Every answer that carries one of these (the resize
    routes, a live controller's job) is made here, so each has one shape."""
    # The pending grow says how many tasks it adds as "min"/"max": "min_tasks" and
    # "max_tasks" beside it in the status are the job's bounds, a different thing.
    conv.register_unstructure_hook(
        PendingGrow,
        make_dict_unstructure_fn(
            PendingGrow,
            conv,
            min_add=override(rename="min"),
            max_add=override(rename="max"),
            notify_cmd=override(omit=True),
            # Said once, as the answer's "demand" (the pending grow when it is the
            # autoresize demand).
            auto=override(omit=True),
            ready_timeout=override(omit=True),
        ),
    )
    # The target as the job sees it: its notification command is the job's own.
    conv.register_unstructure_hook(
        Target, make_dict_unstructure_fn(Target, conv, notify_cmd=override(omit=True))
    )
    status_fields = make_dict_unstructure_fn(
        ResizeStatus, conv, in_flight=override(omit=True), in_flight_tasks=override(omit=True)
    )

    def status(value: ResizeStatus) -> dict[str, Any]:
        data: dict[str, Any] = status_fields(value)
        data["demand"] = conv.unstructure(value.demand)
        data["hosts"] = host_counts(value.tasks)
        data["in_flight"] = (
            None
            if value.in_flight is None
            else {"kind": value.in_flight.value, "tasks": conv.unstructure(value.in_flight_tasks)}
        )
        return data

    # Allocations in a record are {host: tasks}, as a scenario's resize_records show them.
    counts = override(unstruct_hook=host_counts)
    record_fields = make_dict_unstructure_fn(
        ResizeRecord, conv, kind=override(rename="type"), before=counts, delta=counts, after=counts
    )

    def record(value: ResizeRecord) -> dict[str, Any]:
        data: dict[str, Any] = record_fields(value)
        # The task ids of the delta go before the version, where the answers always had them.
        version = data.pop("version")
        reason = data.pop("reason")
        data["delta_tasks"] = [t.id for t in value.delta]
        data["version"] = version
        if reason is not None:
            # Only an involuntary change says why (docs/failover.md: host_failure).
            data["reason"] = reason
        return data

    # Registered before the history's hook is made: cattrs looks the records' hook up then.
    conv.register_unstructure_hook(ResizeRecord, record)
    usage_fields = make_dict_unstructure_fn(Usage, conv)

    def usage(value: Usage) -> dict[str, Any]:
        data: dict[str, Any] = usage_fields(value)
        data["slot_seconds"] = float(value.slot_seconds)
        return data

    conv.register_unstructure_hook(ResizeStatus, status)
    conv.register_unstructure_hook(Usage, usage)


JOURNAL = _make_journal_converter()
# The journal's JSON is written at every transition (facts, state, history rows):
# orjson writes the same compact JSON as ``json.dumps(separators=(",", ":"))``, UTF-8
# rather than \u escapes, an order of magnitude faster. Times must be finite (orjson
# writes NaN as null, which then fails to decode: never silently another number).


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
        raise errors.JournalError(f"cannot be written to the journal: {exc}") from None


API = _make_api_converter()


# Each fact class's own unstructure hook, looked up once: the tagged union's dispatch
# costs more than the fact itself, and facts are encoded at every transition. The tag
# goes last, where the union strategy puts it (the bytes are the same; tested).
_FACT_HOOKS: dict[type, Any] = {cls: JOURNAL.get_unstructure_hook(cls) for cls in FACT_TYPES}


def encode_fact(fact: Fact) -> bytes:
    cls = type(fact)
    data = _FACT_HOOKS[cls](fact)
    data["type"] = cls.__name__
    return _dumps(data)


def _describe(exc: Exception) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, path="$", format_exception=_format))
    return f"{type(exc).__name__}: {exc}"


def decode_fact(data: bytes) -> Fact:
    """Decode a stored fact; a record that does not decode is a JournalError."""
    try:
        fact: Fact = JOURNAL.structure(orjson.loads(data), Fact)  # type: ignore[arg-type]
    except Exception as exc:
        raise errors.JournalError(f"undecodable fact: {_describe(exc)}") from None
    return fact


# A job's state is written at every transition. Its history (resize records, each with
# three allocations, and charge steps) grows with every resize, so it is stored apart, one
# row per item (journal ``history``), and a transition writes only what changed at its
# end: the cost of a write follows the live allocation, not the job's past.
_HISTORY_FIELDS = ("records", "charges")


def _state_without_history(conv: cattrs.Converter) -> Any:
    # A state without a target keeps the bytes it always had (and older journals read).
    return make_dict_unstructure_fn(
        ResizeState,
        conv,
        records=override(omit=True),
        charges=override(omit=True),
        ready=override(omit_if_default=True),
        target=override(omit_if_default=True),
    )


_unstructure_live_state = _state_without_history(JOURNAL)


def encode_state(state: ResizeState) -> bytes:
    """The state's journal payload, without its history (see :func:`history_tails`)."""
    return _dumps(_unstructure_live_state(state))


def encode_record(record: ResizeRecord) -> bytes:
    return _dumps(JOURNAL.unstructure(record))


def encode_charge(charge: tuple[float, int]) -> bytes:
    return _dumps(charge)


def _tail(name: str, old: tuple[Any, ...], new: tuple[Any, ...], encode: Any) -> Tail | None:
    """What changed at the end of one history sequence; ``None`` if nothing did."""
    if old == new:  # the same object mostly: tuples compare identical items at once
        return None
    # The longest common prefix. Only the end ever changes (a record or a charge step
    # added, the last step replaced), so the first or second comparison finds it; the
    # loop keeps any other change correct too.
    start = min(len(old), len(new))
    while old[:start] != new[:start]:
        start -= 1
    return Tail(name, start, tuple(encode(item) for item in new[start:]), len(old))


def history_tails(before: ResizeState | None, after: ResizeState) -> tuple[Tail, ...]:
    """The history rows a transition from ``before`` to ``after`` writes."""
    tails = (
        _tail("records", before.records if before else (), after.records, encode_record),
        _tail("charges", before.charges if before else (), after.charges, encode_charge),
    )
    return tuple(t for t in tails if t is not None)


def decode_state(stored: StoredState) -> ResizeState:
    """Decode a stored state with its history; a record that does not decode is a
    JournalError."""
    try:
        data = orjson.loads(stored.state)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        for name in _HISTORY_FIELDS:
            if name in data:
                raise ValueError(f"unexpected key {name!r}: the history is stored apart")
        data["records"] = [orjson.loads(row) for row in stored.records]
        data["charges"] = [orjson.loads(row) for row in stored.charges]
        return JOURNAL.structure(data, ResizeState)
    except Exception as exc:
        raise errors.JournalError(f"undecodable job state: {_describe(exc)}") from None


def structure_or_error(data: Any, cls: type[T], what: str) -> T:
    """Structure API input, or raise InvalidRequest naming every bad field."""
    try:
        return API.structure(data, cls)
    except Exception as exc:  # cattrs raises ClassValidationError and plain errors
        raise errors.InvalidRequest(f"{what}: {_describe(exc)}") from None


def _format(exc: BaseException, type_: Any) -> str:
    # Our strict hooks say what was wrong with the value; keep their words.
    if isinstance(exc, TypeError) and str(exc).startswith("expected "):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


def grow_from_json(data: Mapping[str, Any]) -> GrowRequest:
    """The REST/scenario grow body: ``tasks`` (max), optional ``min_tasks``, options."""
    body = dict(_object(data, "grow"))
    for internal in ("max_add", "min_add"):
        # The model's own names are not part of the API: refuse them like any unknown key.
        if internal in body:
            raise errors.InvalidRequest(f"grow: unknown field {internal!r} @ $.{internal}")
    if "tasks" not in body:
        raise errors.InvalidRequest("grow: missing 'tasks' @ $.tasks")
    tasks = body.pop("tasks")
    body["max_add"] = tasks
    body["min_add"] = body.pop("min_tasks", tasks)
    try:
        return structure_or_error(body, GrowRequest, "grow")
    except errors.InvalidRequest as exc:
        # Name the fields as the caller wrote them, not as the model calls them.
        text = (
            (exc.detail or "").replace("$.max_add", "$.tasks").replace("$.min_add", "$.min_tasks")
        )
        raise errors.InvalidRequest(text) from None


def release_from_json(data: Mapping[str, Any]) -> ReleaseRequest:
    """The REST/scenario release body: one of spec, hosts, task_ids, count, and options."""
    body = dict(_object(data, "release"))
    return structure_or_error(body, ReleaseRequest, "release")


def modify_from_json(data: Mapping[str, Any]) -> AutoresizeRequest:
    """The REST/scenario modify body: ``{"autoresize": true|false}``."""
    body = _object(data, "modify")
    unknown = sorted(str(k) for k in body if k != "autoresize")
    if unknown:
        raise errors.InvalidRequest(f"modify: unknown field {unknown[0]!r} @ $.{unknown[0]}")
    if "autoresize" not in body:
        raise errors.InvalidRequest("modify: missing 'autoresize' @ $.autoresize")
    value = body["autoresize"]
    if type(value) is not bool:
        raise errors.InvalidRequest(
            f"modify: expected true or false, got {type(value).__name__} {value!r} @ $.autoresize"
        )
    return AutoresizeRequest(value)


def target_from_json(data: Any) -> TargetRequest:
    """The REST/scenario target body: ``{"tasks": N, "release_prefer": [task ids]}``."""
    body = dict(_object(data, "target"))
    if "tasks" not in body:
        raise errors.InvalidRequest("target: missing 'tasks' @ $.tasks")
    if body["tasks"] is None:
        raise errors.InvalidRequest(
            "target: expected int, got NoneType None @ $.tasks (DELETE clears the target)"
        )
    return structure_or_error(body, TargetRequest, "target")


def status_json(status: ResizeStatus) -> dict[str, Any]:
    """The ``ResizeStatus`` answer: allocation, bounds, pending grow, change in flight."""
    data: dict[str, Any] = API.unstructure(status)
    return data


def history_json(usage: Usage) -> dict[str, Any]:
    """The ``ResizeHistory`` answer: the charged-slots timeline and the resize records."""
    data: dict[str, Any] = API.unstructure(usage)
    return data


def record_json(record: ResizeRecord) -> dict[str, Any]:
    """One resize record, the same shape as a scenario's ``resize_records`` entries."""
    data: dict[str, Any] = API.unstructure(record)
    return data


def _object(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise errors.InvalidRequest(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


__all__ = [
    "API",
    "FACT_TYPES",
    "JOURNAL",
    "decode_fact",
    "decode_state",
    "encode_charge",
    "encode_fact",
    "encode_record",
    "encode_state",
    "grow_from_json",
    "history_json",
    "history_tails",
    "modify_from_json",
    "record_json",
    "release_from_json",
    "status_json",
    "structure_or_error",
    "target_from_json",
]
