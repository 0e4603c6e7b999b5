"""The cattrs converters: the journal's encoding and the JSON API's, kept apart from the
models (docs/architecture.md, "Models we follow").

Facts are encoded as compact JSON objects tagged with ``"type"`` (the class name), so
``journal export`` writes readable JSON lines and a newer fact type is recognisable.
Decoding rejects unknown keys; :func:`structure_or_error` turns cattrs' nested errors
into one ``InvalidRequest`` whose message lists each problem as ``… @ $.path``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import cattrs
import orjson
from cattrs.gen import make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from xce_resize_plugin import errors
from xce_resize_plugin.core.accounting import Usage
from xce_resize_plugin.core.facts import (
    FACT_TYPES,
    Fact,
    GrowRequested,
    JobEnded,
    ReleaseAccepted,
    TasksLost,
    TasksStopped,
    TaskStopped,
)
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    Change,
    GrowRequest,
    PendingGrow,
    ReleaseRequest,
    ResizeRecord,
    ResizeState,
    Target,
    TargetRequest,
    Task,
    host_counts,
)
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.core.strict_json import describe, strict_converter
from xce_resize_plugin.core.task_codec import (
    DecodedTasks,
    EncodedTasks,
    HostNumbers,
    TaskKeep,
    encode_tasks,
)
from xce_resize_plugin.journal import StoredState, Tail

T = TypeVar("T")


class _EncodedTasks:
    """The journal's encoding of task tuples, kept for the tuples last encoded.

    A job's allocation is the same tuple from one transition to the next until a
    resize commits, and a resize record's allocations are the tuples its states held:
    a job of many hosts would have the same tens of thousands of pairs encoded again
    at every transition. The bytes depend only on the tuple's contents (tuples do not
    change), and a kept tuple stays referenced, so its ``id`` is not reused while
    kept. Small tuples are encoded each time (cheaper than the look-up). At most
    ``budget`` tasks are kept, the oldest dropped first.
    """

    __slots__ = ("_keep", "_numbers", "_small")

    def __init__(self, budget: int = 1 << 18, small: int = 256) -> None:
        #: The host names seen, parsed once (runs of numbered hosts, schema 5).
        self._numbers = HostNumbers()
        #: A kept tuple stays alive with its tasks: by default some 30 MB at most with
        #: the bytes; a larger budget gained nothing measurable on a 65,536-host
        #: workload and cost 160 MB more (docs/performance.md).
        self._keep: TaskKeep[int, tuple[Sequence[Task], orjson.Fragment]] = TaskKeep(budget)
        #: Tuples shorter than this are not kept: most jobs, with nothing to gain.
        self._small = small

    def __call__(self, tasks: Sequence[Task]) -> EncodedTasks | orjson.Fragment:
        n = len(tasks)
        if n < self._small:
            return encode_tasks(tasks, self._numbers)
        kept = self._keep.get(id(tasks))
        if kept is not None and kept[0] is tasks:
            return kept[1]
        encoded = orjson.Fragment(_dumps(encode_tasks(tasks, self._numbers)))
        self._keep.put(id(tasks), (tasks, encoded), n)
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
    conv.register_structure_hook_func(_is_tasks, DecodedTasks())
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
        JobEnded, make_dict_unstructure_fn(JobEnded, conv, requeued=omit)
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


def _make_api_converter() -> cattrs.Converter:
    # cattrs would coerce "3" to 3, 2.5 to 2 and 1 to True; API input must say what it
    # means.
    conv = strict_converter(forbid_extra_keys=True)
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


def decode_fact(data: bytes) -> Fact:
    """Decode a stored fact; a record that does not decode is a JournalError."""
    try:
        fact: Fact = JOURNAL.structure(orjson.loads(data), Fact)  # type: ignore[arg-type]
    except Exception as exc:
        raise errors.JournalError(f"undecodable fact: {describe(exc)}") from None
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
        requeued=override(omit_if_default=True),
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
        raise errors.JournalError(f"undecodable job state: {describe(exc)}") from None


def structure_or_error(data: Any, cls: type[T], what: str) -> T:
    """Structure API input, or raise InvalidRequest naming every bad field."""
    try:
        return API.structure(data, cls)
    except Exception as exc:  # cattrs raises ClassValidationError and plain errors
        raise errors.InvalidRequest(f"{what}: {describe(exc)}") from None


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
