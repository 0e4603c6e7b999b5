"""The in-job API's requests, free of any transport: one definition of what each call
sends and how it reads the answers, driven by the synchronous client (urllib, standard
library only: :mod:`.client`) and by the asynchronous one (httpx: :mod:`.aio`).

Each call is a generator (a :data:`Steps`) that yields the :class:`Request` objects to
send, receives each decoded answer (or has the controller's
:class:`~xce_resize_plugin.rest.client.RemoteError` thrown in), and returns the
call's result; the clients only send and await. So the two clients cannot drift: a
grow's body, a long poll's stop rule, the key-value store's wait loop exist once.
"""

from __future__ import annotations

import math
import numbers
import os
import random
import time
import urllib.parse
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.rest.client import RemoteError

#: A long poll never asks the controller to hold a request longer than this.
MAX_POLL = 30.0
#: A request refused because the job's owner has too many in progress (429
#: ``XCE_TOO_MANY_REQUESTS``: the tasks of a large job all waiting at once), or because
#: the server has no connection to spare (its plain 503, ``HTTP_503``:
#: docs/live-controller.md, "Connections and descriptors"), is sent again after this
#: many seconds, at most :data:`BUSY_RETRIES` times before the refusal is the call's
#: answer. Neither changed anything. The wait is the answer's ``Retry-After`` when it
#: gives one in seconds, kept between :data:`BUSY_WAIT` and :data:`BUSY_WAIT_MAX` (a
#: proxy's ``0`` would have the tasks of a large job hammer it; an hour would hold the
#: call for ever), else :data:`BUSY_WAIT`. A long poll is asked again for the time then
#: left (none, past its call's deadline), so that a call that waits answers at its
#: timeout, or as soon as the controller answers again if it was busy then.
BUSY_WAIT = 1.0
BUSY_WAIT_MAX = 30.0
BUSY_RETRIES = 60
#: A busy refusal's wait is lengthened by up to this share of it, at random: the tasks of
#: a large job refused together would otherwise all come back in the same instant, and
#: be refused together again.
BUSY_SPREAD = 0.5
_SPREAD = random.Random()
#: The least time between the long polls of one call (seconds): a controller answers a
#: poll early when something changed, a few times per resize; something else at the
#: URL that answers every poll at once (a proxy ignoring the poll) was polled 2,300
#: times a second, for ever with no timeout.
POLL_GAP = 0.05
#: The longest job id the controller takes (core/models.py ``MAX_JOB_ID``, not imported:
#: this module imports the standard library only).
MAX_JOB_ID = 64

_T = TypeVar("_T")


@dataclass(frozen=True)
class Request:
    """One HTTP request a call makes: ``timeout`` (seconds) covers a long poll.

    A long poll (:func:`long_poll`) also has its call's ``deadline``
    (``time.monotonic()``) and ``path_for``, its path for a given poll length, so
    that it can be asked again for the time left (:meth:`again`)."""

    method: str
    path: str
    body: Any = None
    timeout: float | None = None
    deadline: float | None = None
    path_for: Callable[[float], str] | None = field(default=None, compare=False)
    #: Seconds to wait before sending it (an events poll after one answered at once).
    delay: float = 0.0

    def again(self) -> Request:
        """This request to send again now: a long poll for the time then left."""
        if self.path_for is None:
            return self
        return long_poll(self.path_for, self.deadline)


def long_poll(
    path_for: Callable[[float], str], deadline: float | None, delay: float = 0.0
) -> Request:
    """A GET that the controller holds until something happens or the poll ends: for
    the time left until ``deadline`` (``None``: no deadline) once ``delay`` seconds
    passed, at most :data:`MAX_POLL`. Its own limit allows 10 s more, for a loaded
    controller."""
    left = MAX_POLL if deadline is None else deadline - time.monotonic() - delay
    poll = max(0.0, min(MAX_POLL, left))
    return Request(
        "GET",
        path_for(poll),
        timeout=poll + 10.0,
        deadline=deadline,
        path_for=path_for,
        delay=delay,
    )


#: A call: yields requests, is sent their decoded answers, returns its result.
Steps = Generator[Request, Any, _T]


class Pacer:
    """Keeps a client's long polls :data:`POLL_GAP` apart: one per client, shared by
    its calls (an ``events()`` cursor makes one call per poll)."""

    def __init__(self) -> None:
        self._polled_at: float | None = None

    def pause(self, request: Request) -> float:
        """Seconds to wait before sending ``request`` (0 unless a long poll follows
        the last one too soon)."""
        if request.path_for is None:
            return 0.0
        now = time.monotonic()
        last, self._polled_at = self._polled_at, now
        if last is None or now - last >= POLL_GAP:
            return 0.0
        self._polled_at = last + POLL_GAP
        return last + POLL_GAP - now


class Exchange(Generic[_T]):
    """One call being driven: the clients ask it for the next request, send it, and
    hand back the answer or the controller's refusal; once it has no more requests,
    :attr:`result` is the call's result. The only stepping logic, for both clients."""

    def __init__(self, steps: Steps[_T], pacer: Pacer | None = None) -> None:
        self._steps = steps
        self._pacer = pacer if pacer is not None else Pacer()
        self._answer: Any = None
        self._error: RemoteError | None = None
        self._sent: Request | None = None
        self._again = False
        self._busy = 0
        self.result: _T

    def pause(self) -> float:
        """Seconds to wait before sending the request :meth:`next_request` gave: a long
        poll follows the client's previous one by :data:`POLL_GAP` at least."""
        if self._sent is None:
            return 0.0
        return max(self._sent.delay, self._pacer.pause(self._sent))

    def next_request(self) -> Request | None:
        """The next request to send, or ``None`` when the call is done."""
        if self._again and self._sent is not None:  # the last one, refused as busy
            self._again = False
            self._sent = self._sent.again()
            return self._sent
        steps, error, sent = self._steps, self._error, self._sent
        try:
            self._sent = steps.send(self._answer) if error is None else steps.throw(error)
        except StopIteration as done:
            self.result = done.value
            return None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            if error is not None or sent is None:
                raise  # the call's own error, or a bug before any answer: not the answer's
            # An answer of another shape than a controller's (another service at the
            # URL, a proxy's page): the documented error, not a KeyError.
            raise Unreachable(
                f"the answer to {sent.method} {sent.path} is not a controller's "
                f"({type(exc).__name__}: {exc})"
            ) from None
        return self._sent

    def answered(self, answer: Any) -> None:
        self._answer, self._error = answer, None
        self._busy = 0  # the retries are counted per request, not per call

    def refused(self, error: RemoteError) -> float:
        """Hand back the controller's refusal; the seconds to wait before the same
        request is sent again (0: it is not, the call sees the refusal)."""
        # A plain 503 is asked again when nothing of the request can have been done: a
        # refusal our servers send before the application sees it, or a GET. A proxy's
        # 503 may come after it forwarded a grow, which must not be sent twice.
        plain_503 = error.code == "HTTP_503" and (
            error.unprocessed or (self._sent is not None and self._sent.method == "GET")
        )
        busy = error.http_status == 429 or plain_503
        if busy and self._busy < BUSY_RETRIES:
            self._busy += 1
            self._again = True
            asked = error.retry_after
            wait = BUSY_WAIT if asked is None else min(max(asked, BUSY_WAIT), BUSY_WAIT_MAX)
            return min(wait * (1 + BUSY_SPREAD * _SPREAD.random()), BUSY_WAIT_MAX)
        self._answer, self._error = None, error
        return 0.0


@dataclass(frozen=True)
class Allocation:
    """The job's allocation as the controller reports it."""

    job_id: str
    phase: str
    version: int
    tasks: tuple[tuple[int, str], ...]
    min_tasks: int
    max_tasks: int
    pending: Mapping[str, int] | None = None
    in_flight: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: The job's target size (``{"tasks": N, "release_prefer": [...]}``), if one is set.
    target: Mapping[str, Any] | None = None

    @property
    def hosts(self) -> dict[str, int]:
        """Tasks per host, in allocation order (first host holds task 0)."""
        out: dict[str, int] = {}
        for _, host in self.tasks:
            out[host] = out.get(host, 0) + 1
        return out

    @property
    def size(self) -> int:
        return len(self.tasks)

    @property
    def settled(self) -> bool:
        """No grow pending and no change in flight."""
        return self.pending is None and self.in_flight is None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Allocation:
        return cls(
            job_id=str(doc["job_id"]),
            phase=str(doc["phase"]),
            version=int(doc["version"]),
            tasks=tuple((int(t["id"]), str(t["host"])) for t in doc["tasks"]),
            min_tasks=int(doc["min_tasks"]),
            max_tasks=int(doc["max_tasks"]),
            pending=doc.get("pending"),
            in_flight=doc.get("in_flight"),
            raw=doc,
            target=doc.get("target"),
        )


class WaitOptions(TypedDict, total=False):
    """Whether a call waits for its outcome: ``wait`` (default ``False``), at most
    ``timeout`` seconds (default 60; ``None``: no limit). ``set_target`` takes these
    alone."""

    wait: bool
    timeout: float | None


class ChangeOptions(WaitOptions, total=False):
    """The options every change (``grow``, ``release``) takes, all by keyword.

    ``wait`` (default ``False``): return once the change is committed (or given up),
    waiting at most ``timeout`` seconds (default 60). ``cancel_pending`` (LSF's ``-c``)
    cancels the job's pending grow first; ``notify_cmd`` (``-rnc``) is the notification
    command for this change, ``no_notify`` (``-rncn``) runs none; by default the job's
    own command runs. ``if_version``: refused (``XCE_RESIZE_VERSION_CHANGED``) unless
    the allocation is still at that version.
    """

    cancel_pending: bool
    notify_cmd: str | None
    no_notify: bool
    if_version: int | None


class GrowOptions(ChangeOptions, total=False):
    """A grow's options: those of every change, and its readiness wait.

    ``wait_ready`` (default ``False``): the grow is committed — the job's ``wait()``
    sees the new version — only once every new task called :meth:`ready`, waiting at
    most ``ready_timeout`` seconds from their launch (default and bound: the site's
    ``[resize] max_ready_timeout``); tasks not ready by then are stopped.
    """

    wait_ready: bool
    ready_timeout: float


class ReleaseOptions(ChangeOptions, total=False):
    """A release's forms and options, all by keyword.

    Exactly one form: ``hosts`` (all of the job's tasks there), ``host_counts`` (that
    many tasks on each host; ``hosts`` and ``host_counts`` may be given together),
    ``task_ids``, a ``count`` chosen by the site policy, or an LSF ``spec``. Task 0
    always stays. ``grace``: seconds the tasks may drain before they are stopped
    (default: the job's, given at submission). And the options of every change.
    """

    hosts: Sequence[str] | None
    host_counts: Mapping[str, int] | None
    task_ids: Sequence[int] | None
    count: int | None
    spec: str | None
    grace: float | None


def seconds(name: str, value: object) -> float | None:
    """``value`` as the seconds argument ``name`` (``None``: none given); a wrong one
    is refused before any request, naming the argument (a string or NaN was sent on,
    or waited on for ever, after the change it waits for was applied)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise ValueError(
            f"{name} must be a finite number of seconds, 0 or more, got {_shown(value)}"
        )
    return number


def wait_flag(options: WaitOptions) -> bool:
    """The ``wait`` option, refused unless a bool."""
    wait = options.get("wait", False)
    if not isinstance(wait, bool):
        raise TypeError(f"wait must be True or False, got {_shown(wait)}")
    return wait


def wait_options(options: WaitOptions) -> tuple[bool, float | None]:
    """A change's ``wait`` and ``timeout`` (default 60 s; ``None``: no limit), checked
    before any request."""
    return wait_flag(options), seconds("timeout", options.get("timeout", 60.0))


def version_number(name: str, value: object) -> int:
    """An allocation version given as ``name``: an int from 0 (it goes in a query)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {_shown(value)}")
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value}")
    return value


def _shown(value: object) -> str:
    """``value`` for an error message: its repr, cut to one short line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def check_job_id(job_id: object) -> str:
    """``job_id``, refused (``ValueError``) when no controller would take it, the same
    for both clients: the sync one sent a 100,000-character id and was refused 400, the
    async one could not build so long a URL."""
    if not isinstance(job_id, str):
        raise TypeError(f"job id must be a str, got {_shown(job_id)}")
    if not 1 <= len(job_id) <= MAX_JOB_ID or not job_id.isprintable():
        raise ValueError(
            f"job id must be 1 to {MAX_JOB_ID} printable characters, got {_shown(job_id)}"
        )
    return job_id


def own_task_id(environ: Mapping[str, str] | None = None) -> int:
    """The calling task's id (``XCE_TASK_ID``); refuses outside a task."""
    env = os.environ if environ is None else environ
    text = env.get("XCE_TASK_ID")
    if not text:
        raise RuntimeError(
            "not inside an XCE task: XCE_TASK_ID is not set (give the task id explicitly)"
        )
    task_id = read_decimal(text)
    if task_id is None:
        raise RuntimeError(f"XCE_TASK_ID is not a task id (a decimal number): {_shown(text)}")
    return task_id


class JobRequests:
    """The calls of the in-job API for one job, as :data:`Steps`."""

    def __init__(self, job_id: str) -> None:
        self.job_id = check_job_id(job_id)
        self.job_path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}"
        self.base = f"{self.job_path}/resize"

    def allocation(self) -> Steps[Allocation]:
        return Allocation.from_json((yield Request("GET", self.base)))

    def history(self) -> Steps[Mapping[str, Any]]:
        result: Mapping[str, Any] = yield Request("GET", f"{self.base}/history")
        return result

    def wait(
        self, after_version: int | None, timeout: float | None, changing: bool = False
    ) -> Steps[Allocation]:
        """``changing``: the caller just made a change, so the job settled without a
        new version means that change was given up (a grow's wait). Without
        ``after_version``, the allocation as it is once settled: at once if it is.
        ``timeout`` ``None``: no limit."""
        limit = seconds("timeout", timeout)
        if after_version is not None:
            version_number("after_version", after_version)
        deadline = None if limit is None else time.monotonic() + limit
        if after_version is None:
            now = yield from self.allocation()
            if now.settled:
                return now
            # The route waits for a version past the one given: the one before the
            # current one, but a job at version 0 has none (the route refuses -1).
            after_version = max(now.version - 1, 0)
        path = f"{self.base}/wait?version={after_version}&timeout="
        polled = [0.0, 0.0]  # when the last poll was sent, and for how long

        def path_for(seconds: float) -> str:
            asked = f"{seconds:.3f}"
            # The poll as asked (to the millisecond): a poll held for exactly that long
            # is one that ran out, not one that ended early (0.1994 s asked as 0.199).
            polled[:] = [time.monotonic(), float(asked)]
            return f"{path}{asked}"

        while True:
            doc = yield long_poll(path_for, deadline)
            alloc = Allocation.from_json(doc)
            # Done, or nothing more will happen without a new request (a change seen in
            # this wait failed or was cancelled: the poll ended early, or the job was
            # changing at the previous one), or the job ended, or out of time: answer
            # now. A poll that merely ran out (the job settled throughout) is not the end.
            # ``gave_up`` says it exactly; a controller without it is judged by the
            # time the poll took (one that gives up right at its end reads as run out).
            gave_up = doc.get("gave_up")
            sent, poll = polled
            early = gave_up if isinstance(gave_up, bool) else time.monotonic() - sent < poll
            ended = changing or early
            finished = doc.get("job_state") not in (None, "RUN")
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if doc.get("done") or (alloc.settled and ended) or finished or out_of_time:
                return alloc
            changing = not alloc.settled

    def grow(
        self, min_tasks: int, max_tasks: int | None, options: GrowOptions
    ) -> Steps[Allocation]:
        body: dict[str, Any] = {
            "tasks": max_tasks if max_tasks is not None else min_tasks,
            "min_tasks": min_tasks,
            **_change_fields(options, GrowOptions),
        }
        if options.get("wait_ready", False):
            body["wait_ready"] = True
        if "ready_timeout" in options:
            body["ready_timeout"] = options["ready_timeout"]
        return (yield from self._change("grow", body, options))

    def ready(self, task_id: int | None) -> Steps[Mapping[str, Any]]:
        """Task ``task_id`` (default: the calling task) is ready for work."""
        tid = own_task_id() if task_id is None else task_id
        result: Mapping[str, Any] = yield Request("POST", f"{self.job_path}/tasks/{tid}/ready")
        return result

    def release(self, options: ReleaseOptions) -> Steps[Allocation]:
        body = _change_fields(options, ReleaseOptions)
        forms = release_forms(
            options.get("hosts"),
            options.get("host_counts"),
            options.get("task_ids"),
            options.get("count"),
            options.get("spec"),
        )
        given = {k: v for k, v in forms.items() if v is not None}
        if len(given) != 1:
            raise ValueError("give exactly one of hosts/host_counts, task_ids, count, spec")
        body.update(given)
        grace = options.get("grace")
        if grace is not None:
            body["grace"] = grace
        return (yield from self._change("release", body, options))

    # --- drain before stop and job events (docs/in-job-api.md) ------------------------

    def drained(self, task_ids: Sequence[int]) -> Steps[Allocation]:
        doc = yield Request("POST", f"{self.base}/drained", {"task_ids": list(task_ids)})
        return Allocation.from_json(doc)

    def events(self, after: int | None, timeout: float | None) -> EventCursor:
        return EventCursor(self.job_path, after, seconds("timeout", timeout))

    def cancel(self) -> Steps[Allocation]:
        yield Request("DELETE", f"{self.base}/pending")
        return (yield from self.allocation())

    # --- a target size (docs/in-job-api.md, "A target size") ---------------------------

    def set_target(
        self, tasks: int, release_prefer: Sequence[int], options: WaitOptions
    ) -> Steps[Allocation]:
        refuse_unknown(options, WaitOptions)
        wait, timeout = wait_options(options)
        body = {"tasks": tasks, "release_prefer": list(release_prefer)}
        alloc = Allocation.from_json((yield Request("PUT", f"{self.base}/target", body)))
        if not wait:
            return alloc
        return (yield from self.reach(tasks, alloc, timeout))

    def clear_target(self) -> Steps[Allocation]:
        return Allocation.from_json((yield Request("DELETE", f"{self.base}/target")))

    def reach(self, tasks: int, alloc: Allocation, timeout: float | None) -> Steps[Allocation]:
        """Wait until the job holds ``tasks`` with nothing pending or in flight; or its
        target is gone (cleared, replaced by a manual change, given up), the job
        ended, or ``timeout`` seconds passed (``None``: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            reached = alloc.size == tasks and alloc.settled
            ended = alloc.raw.get("job_state") not in (None, "RUN")
            if reached or alloc.target is None or ended or (left is not None and left <= 0):
                return alloc
            alloc = yield from self.wait(alloc.version, left)

    def put(self, key: str, value: str) -> Steps[int]:
        doc = yield Request("PUT", self._kv(key), {"value": value})
        return int(doc["version"])

    def get(self, key: str, wait: float | None) -> Steps[str | None]:
        wait = seconds("wait", wait)
        deadline = time.monotonic() + (wait or 0.0)
        path = f"{self._kv(key)}?wait="
        while True:
            # Without a wait, a plain request: asked again when busy as any other.
            request = (
                long_poll(lambda seconds: f"{path}{seconds:.3f}", deadline)
                if wait
                else Request("GET", f"{path}0.000", timeout=10.0)
            )
            try:
                doc = yield request
            except RemoteError as exc:
                if exc.code != "XCE_KV_NO_KEY":
                    raise
                if deadline - time.monotonic() <= 0:
                    return None
                continue
            return str(doc["value"])

    def delete(self, key: str) -> Steps[bool]:
        try:
            yield Request("DELETE", self._kv(key))
        except RemoteError as exc:
            if exc.code != "XCE_KV_NO_KEY":
                raise
            return False
        return True

    def _kv(self, key: str) -> str:
        return f"{self.job_path}/kv/{urllib.parse.quote(key, safe='')}"

    def _change(
        self, kind: str, body: Mapping[str, Any], options: ChangeOptions
    ) -> Steps[Allocation]:
        wait, timeout = wait_options(options)
        before = (yield from self.allocation()).version
        doc = yield Request("POST", f"{self.base}/{kind}", dict(body))
        if not wait:
            return Allocation.from_json(doc)
        return (yield from self.wait(before, timeout, changing=True))


class EventCursor:
    """Where a reader of the job's events is: the last ``seq`` it has, and when it
    stops (``timeout`` seconds from now, ``None``: never before the job ends). Each
    :meth:`poll` is one long poll (and, when it finds nothing, a look at the job's
    state); :attr:`done` says whether another is due.

    Done after ``job_ended``, or once the job ended and no event is left: a job that
    never resized has no ``job_ended`` event, and one read past it none after it, but
    the controller answers a poll of an ended job at once: it was polled 20 times a
    second for as long as the finished job was kept (docs/in-job-api.md, "Job
    events")."""

    def __init__(self, job_path: str, after: int | None, timeout: float | None) -> None:
        self.path = f"{job_path}/events"
        # The wait route answers at once with timeout 0, and says the job's state.
        self.state_path = f"{job_path}/resize/wait?version=0&timeout=0.000"
        self.after = 0 if after is None else after
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.done = False
        self._answered = False
        self._delay = 0.0

    def poll(self) -> Steps[list[dict[str, Any]]]:
        """One long poll: the events after the cursor (possibly none), the cursor moved
        past them."""
        delay, self._delay = self._delay, 0.0
        found, early = yield from self._events(self.deadline, delay)
        if found or found is None or self._out_of_time():
            return self._take(found)
        ended = yield from self._ended()
        if ended:
            # The events the job left are those a poll from now finds (its last may
            # have been written just after the poll above looked): none, the end.
            found, _ = yield from self._events(time.monotonic(), 0.0)
            return self._take(found, ended=not found)
        if early:
            # Answered at once with nothing on a running job (no controller holds such
            # a poll: a proxy's answer): not asked again at once.
            self._delay = self._left(BUSY_WAIT)
        return []

    def _events(
        self, deadline: float | None, delay: float
    ) -> Steps[tuple[list[dict[str, Any]] | None, bool]]:
        """A poll's events (``None``: the job's token was refused, the job ended) and
        whether it answered before the time it asked for."""
        path = f"{self.path}?after={self.after}&timeout="
        polled = [0.0, 0.0]
        # Only the first sending waits ``delay``: a poll sent again (the controller was
        # busy) goes at once, and counting the delay again would make a poll held for
        # its whole time look answered early.
        delays = [delay]

        def path_for(seconds: float) -> str:
            asked = f"{seconds:.3f}"
            polled[:] = [time.monotonic() + delays[0], float(asked)]
            delays[0] = 0.0
            return f"{path}{asked}"

        try:
            found = yield long_poll(path_for, deadline, delay)
        except RemoteError as exc:
            if not self._ended_token(exc):
                raise
            return None, False
        self._answered = True
        sent, asked = polled
        return list(found), time.monotonic() - sent < asked

    def _ended(self) -> Steps[bool]:
        """Whether the job ended (its state, or its token refused since)."""
        try:
            doc = yield Request("GET", self.state_path, timeout=10.0)
        except RemoteError as exc:
            if not self._ended_token(exc):
                raise
            return True
        return doc.get("job_state") in ("DONE", "EXIT")

    def _ended_token(self, error: RemoteError) -> bool:
        """A 401 once this cursor was answered: the job's token, which is refused from
        the job's end on (docs/in-job-api.md, "Job events"); so is a user's token
        revoked meanwhile, which ends the cursor too."""
        return error.http_status == 401 and self._answered

    def _take(
        self, found: list[dict[str, Any]] | None, ended: bool = False
    ) -> list[dict[str, Any]]:
        """The events a poll found (``None``: the job's end), the cursor past them."""
        if found is None:
            self.done = True
            return []
        if found:
            self.after = int(found[-1]["seq"])
        last = any(event.get("type") == "job_ended" for event in found)
        self.done = ended or last or self._out_of_time()
        return found

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _left(self, at_most: float) -> float:
        """The time left before the deadline, at most ``at_most`` and not below 0."""
        left = at_most if self.deadline is None else self.deadline - time.monotonic()
        return max(0.0, min(at_most, left))


def release_forms(
    hosts: Sequence[str] | None,
    host_counts: Mapping[str, int] | None,
    task_ids: Sequence[int] | None,
    count: int | None,
    spec: str | None,
) -> dict[str, Any]:
    """A release's forms as body fields (``None``: not given)."""
    return {
        "hosts": None
        if hosts is None and host_counts is None
        else {**dict.fromkeys(hosts or (), None), **dict(host_counts or {})},
        "task_ids": list(task_ids) if task_ids is not None else None,
        "count": count,
        "spec": spec,
    }


def refuse_unknown(options: Mapping[str, Any], allowed: type) -> None:
    """Refuse a keyword the TypedDict ``allowed`` (with its bases) does not name, as a
    parameter list would."""
    unknown = options.keys() - allowed.__annotations__.keys()
    if unknown:
        raise TypeError(f"unexpected keyword argument {min(unknown)!r}")


def _change_fields(options: ChangeOptions, allowed: type = ChangeOptions) -> dict[str, Any]:
    """The body fields a grow and a release share (``notify_cmd`` only when given);
    refuses an option ``allowed`` does not name, as a parameter list would."""
    refuse_unknown(options, allowed)
    body: dict[str, Any] = {
        "cancel_pending": options.get("cancel_pending", False),
        "no_notify": options.get("no_notify", False),
    }
    notify_cmd = options.get("notify_cmd")
    if notify_cmd is not None:
        body["notify_cmd"] = notify_cmd
    if_version = options.get("if_version")
    if if_version is not None:
        body["if_version"] = if_version
    return body
