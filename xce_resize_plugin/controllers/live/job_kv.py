"""A job's key-value store: where the tasks of one job publish and find each other
(``tcp://host:port`` of a scheduler in task 0, a rendezvous endpoint), through
``PUT``/``GET``/``DELETE /v1/jobs/{id}/kv/{key}`` (docs/in-job-api.md, "Key-value store").

Values are kept in the controller's store as side records ``kv:JOB:KEY`` (so they
survive a failover, sealed with a CRC as every record is) and removed when the job
ends. Every byte comes from a job or a client, so the limits below bound what one job
can make the controller keep, ``[limits] kv_bytes_per_user`` what all of one user's
jobs can (:func:`check_user_bytes`), and keys are checked before they become record
names. Only a job that has started takes values (:func:`check_started`): a pending job
has no task to read them, and one user may have thousands pending.

Each write is durable before its answer, an fsync under the controller's lock, so
:class:`WriteSlots` bounds the writes one user has in progress at once: without it one
user's hundreds of concurrent ``PUT`` loops queued on that lock made every other
user's requests wait behind them. The bound is per user: with several users writing at
once, a request may wait behind four writes of each.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from xce_resize_plugin.core.decimal_text import read_number
from xce_resize_plugin.core.models import JobState
from xce_resize_plugin.errors import InvalidRequest, NotStarted, ResizeError
from xce_resize_plugin.rest.http import counted

#: Limits per job: value bytes (UTF-8), and keys.
MAX_VALUE, MAX_KEYS = 64 * 1024, 64
#: Longest wait a ``GET ...?wait=S`` may ask for (seconds).
MAX_WAIT = 60.0
#: Key-value writes (``PUT`` and ``DELETE``) one user (their jobs' tokens included) may
#: have in progress at once; beyond, 429 ``XCE_TOO_MANY_REQUESTS`` with ``Retry-After``,
#: which the in-job clients send again. Each takes the controller's lock for an fsync:
#: four keep a user's own tasks writing while others wait behind at most four of that
#: user's (of each user writing at the same time).
MAX_WRITES_IN_PROGRESS = 4
#: Key-value writes of all users in progress at once: however many users write, any
#: other request waits behind at most this many fsyncs (a key-value write beyond is
#: refused 429 as above, and sent again by the in-job clients).
MAX_WRITES_IN_ALL = 16
#: The count of every user's writes together (no user name is empty).
_ALL = ""
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class KeyValueLimit(ResizeError):
    """A value or a number of keys over the store's limits."""

    code = "XCE_KV_LIMIT"
    message = "Key-value store limit exceeded"
    http_status = 413


class NoSuchKey(ResizeError):
    """The job has no such key (yet: ``wait`` waits for it)."""

    code = "XCE_KV_NO_KEY"
    message = "No such key"
    http_status = 404


def record_key(job_id: str, key: str) -> str:
    return f"kv:{job_id}:{key}"


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise InvalidRequest(
            f"key {key[:40]!r}: 1 to 128 characters of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit @ $.key"
        )
    return key


def parse_value(body: Any) -> str:
    """The value of a ``PUT`` body ``{"value": "..."}``, checked."""
    if not isinstance(body, Mapping) or set(body) != {"value"}:
        raise InvalidRequest('kv: the body must be {"value": "..."} @ $')
    value = body["value"]
    if not isinstance(value, str):
        raise InvalidRequest("kv: value must be a string @ $.value")
    if len(value.encode()) > MAX_VALUE:
        raise KeyValueLimit(f"a value is at most {MAX_VALUE} bytes")
    return value


def parse_wait(raw: str | None) -> float:
    """``?wait=S``: seconds to wait for a key that is not there yet (0: answer now)."""
    if raw is None:
        return 0.0
    # A plain ASCII number, read as every query number is (float() also took "1_0",
    # " 1 " and other scripts' digits).
    wait = read_number(raw)
    if wait is None or not 0 <= wait <= MAX_WAIT:
        raise InvalidRequest(f"wait must be a number of seconds from 0 to {MAX_WAIT:g} @ wait")
    return wait


def check_room(existing_keys: int, replacing: bool) -> None:
    """Refuse a new key beyond :data:`MAX_KEYS` (replacing a value is always allowed)."""
    if not replacing and existing_keys >= MAX_KEYS:
        raise KeyValueLimit(f"a job has at most {MAX_KEYS} keys")


def check_started(job_id: str, state: JobState) -> None:
    """Refuse a write to a job that has not started (:class:`NotStarted`, 409)."""
    if state is JobState.PEND:
        raise NotStarted(
            f"job {job_id} is PEND: its key-value store takes writes once the job runs"
        )


def check_user_bytes(user: str, held: int, more: int, limit: int) -> None:
    """Refuse a write that would take ``user``'s jobs past ``limit`` stored bytes of
    values (``[limits] kv_bytes_per_user``); ``more`` is what the write adds (a
    replaced value's bytes already deducted: a write that shrinks is always allowed)."""
    if more > 0 and held + more > limit:
        raise KeyValueLimit(
            f"user {user}'s jobs hold {held} bytes of key-value values and this one adds "
            f"{more}, over [limits] kv_bytes_per_user = {limit} (counted as stored: "
            "JSON-escaped)"
        )


class WriteSlots:
    """The key-value writes each user has in progress, at most
    :data:`MAX_WRITES_IN_PROGRESS`, and all users together, at most
    :data:`MAX_WRITES_IN_ALL` (see the module docstring). Only the event loop's thread
    takes and gives slots: no lock is needed around the counts."""

    def __init__(
        self, limit: int = MAX_WRITES_IN_PROGRESS, in_all: int = MAX_WRITES_IN_ALL
    ) -> None:
        self.limit, self.in_all = limit, in_all
        self._held: dict[str, int] = {}

    @contextlib.contextmanager
    def take(self, user: str) -> Iterator[None]:
        """One of ``user``'s slots while the write is served; :class:`TooManyRequests`
        (429, ``Retry-After``) when they are all taken, or all users' are, nothing
        changed."""
        # The total is kept under a name no user has.
        with (
            counted(self._held, user, self.limit, "key-value writes"),
            counted(self._held, _ALL, self.in_all, "key-value writes", "the controller"),
        ):
            yield


def answer(key: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON answer for a stored record: the ``PUT`` body's shape plus its key and
    version (the number of times it was set)."""
    return {"key": key, "value": record["value"], "version": record["version"]}
