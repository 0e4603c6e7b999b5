"""The cattrs converters: the journal's encoding and the JSON API's, kept apart from the
models (DESIGN §3).

Facts are encoded as compact JSON objects tagged with ``"type"`` (the class name), so
``journal export`` writes readable JSON lines and a newer fact type is recognisable.
Decoding rejects unknown keys; :func:`structure_or_error` turns cattrs' nested errors
into one ``InvalidRequest`` whose message lists each problem as ``… @ $.path``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.preconf.json import make_converter
from cattrs.strategies import configure_tagged_union

from . import errors
from .models import (
    FACT_TYPES,
    Fact,
    GrowRequest,
    ReleaseRequest,
    ResizeRecord,
    ResizeState,
    Task,
)

T = TypeVar("T")


def _unstructure_tasks(tasks: tuple[Task, ...]) -> list[list[int | str]]:
    return [[t.id, t.host] for t in tasks]


def _make_journal_converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True)
    # Tasks are the bulk of every record: [id, host] instead of {"id":…, "host":…}.
    conv.register_unstructure_hook(Task, lambda t: [t.id, t.host])
    conv.register_structure_hook(Task, lambda v, _: Task(int(v[0]), str(v[1])))
    # Recovery decodes every live job's state, and tasks are most of it: a direct hook
    # for task tuples is several times faster than cattrs' generic tuple path.
    conv.register_structure_hook_func(
        lambda t: t == tuple[Task, ...],
        lambda v, _: tuple([Task(int(i), str(h)) for i, h in v]),
    )
    # And the other way round: a job's state, with its allocation, is encoded at every
    # transition; cattrs' generic path calls a hook per task through a generator.
    conv.register_unstructure_hook_func(lambda t: t == tuple[Task, ...], _unstructure_tasks)
    configure_tagged_union(Fact, conv, tag_name="type")
    return conv


def _strict(kind: type) -> Any:
    # cattrs would coerce "3" to 3, 2.5 to 2 and 1 to True; API input must say what it means.
    def check(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    return check


def _make_api_converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True)
    for kind in (int, str, bool):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_unstructure_hook(Task, lambda t: {"id": t.id, "host": t.host})
    return conv


JOURNAL = _make_journal_converter()
# json.dumps(..., separators=...) builds a new encoder at every call; one shared
# encoder with the same settings writes the same text (facts and states are encoded
# at every transition).
_compact = json.JSONEncoder(separators=(",", ":")).encode
API = _make_api_converter()


def encode_fact(fact: Fact) -> bytes:
    return _compact(JOURNAL.unstructure(fact, Fact)).encode()


def _describe(exc: Exception) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, path="$", format_exception=_format))
    return f"{type(exc).__name__}: {exc}"


def decode_fact(data: bytes) -> Fact:
    """Decode a stored fact; a record that does not decode is a JournalError."""
    try:
        fact: Fact = JOURNAL.structure(json.loads(data), Fact)  # type: ignore[arg-type]
    except Exception as exc:
        raise errors.JournalError(f"undecodable fact: {_describe(exc)}") from None
    return fact


# A job's state is written at every transition and carries every committed change so
# far (its resize records), so a job resized n times would encode n records again at
# each write: quadratic in its resizes; and a change's tasks are written again at each
# of its task events. Records are immutable, and so are the committed allocation
# between two commits and a change's tasks while it is in flight: their JSON text is
# kept by identity (the object is held too, so its id cannot be reused while cached)
# and spliced in where a mark stood. The bytes are exactly those of the plain encoding
# (tested).
_RECORDS_VALUE = "\x00xce-resize-records\x00"
_TASKS_VALUE = "\x00xce-resize-tasks\x00"
_CHANGE_VALUE = "\x00xce-resize-change-tasks\x00"
_MARKS = {v: json.dumps(v) for v in (_RECORDS_VALUE, _TASKS_VALUE, _CHANGE_VALUE)}
_CACHE_SIZE = 1 << 13
_record_text: dict[int, tuple[ResizeRecord, str]] = {}
_tasks_text: dict[int, tuple[tuple[Task, ...], str]] = {}


def _cached_json(cache: dict[int, tuple[Any, str]], value: Any) -> str:
    hit = cache.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    text = _compact(JOURNAL.unstructure(value))
    if len(cache) >= _CACHE_SIZE:
        cache.clear()  # a bound on memory; live jobs' entries come back at once
    cache[id(value)] = (value, text)
    return text


def _plain_state(state: ResizeState) -> bytes:
    return _compact(JOURNAL.unstructure(state)).encode()


def encode_state(state: ResizeState) -> bytes:
    records, tasks, change = state.records, state.tasks, state.change
    if not records and len(tasks) < 8 and (change is None or len(change.tasks) < 8):
        return _plain_state(state)
    # Without those parts, then a mark in the place of each: same key, same position.
    slim_change = None if change is None else attrs.evolve(change, tasks=())
    data = JOURNAL.unstructure(attrs.evolve(state, records=(), tasks=(), change=slim_change))
    parts = {_RECORDS_VALUE: None, _TASKS_VALUE: None}
    data["records"] = _RECORDS_VALUE
    data["tasks"] = _TASKS_VALUE
    if change is not None:
        data["change"]["tasks"] = _CHANGE_VALUE
        parts[_CHANGE_VALUE] = None
    text = _compact(data)
    cuts = []
    for value in parts:
        mark = _MARKS[value]
        if text.count(mark) != 1:
            return _plain_state(state)  # a mark in a user's string: no shortcut
        cuts.append((text.index(mark), mark, value))
    cuts.sort()
    # Cut at the marks' places in this text (what is spliced in is not searched).
    out: list[str] = []
    at = 0
    for index, mark, value in cuts:
        out.append(text[at:index])
        if value is _RECORDS_VALUE:
            out.append("[" + ",".join([_cached_json(_record_text, r) for r in records]) + "]")
        elif value is _TASKS_VALUE:
            out.append(_cached_json(_tasks_text, tasks))
        else:
            assert change is not None
            out.append(_cached_json(_tasks_text, change.tasks))
        at = index + len(mark)
    out.append(text[at:])
    return "".join(out).encode()


def decode_state(data: bytes) -> ResizeState:
    """Decode a stored state; a record that does not decode is a JournalError."""
    try:
        return JOURNAL.structure(json.loads(data), ResizeState)
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
    "encode_fact",
    "encode_state",
    "grow_from_json",
    "release_from_json",
    "structure_or_error",
]
