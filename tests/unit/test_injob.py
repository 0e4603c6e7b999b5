"""The in-job API's import path stays standard-library only, and its errors are clear."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from xce_resize_plugin.injob import Allocation, ResizeClient, protocol

PROBE = """
import json, sys
before = set(sys.modules)
import xce_resize_plugin.injob
print(json.dumps(sorted(m for m in set(sys.modules) - before
      if m.split('.')[0] in ('attrs', 'attr', 'cattrs', 'pluggy', 'lmdb', 'starlette', 'httpx'))))
"""


def test_import_is_standard_library_only() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_from_env_outside_a_job_says_what_is_missing() -> None:
    with pytest.raises(RuntimeError, match="XCE_JOB_ID, XCE_CONTROLLER_URL"):
        ResizeClient.from_env({})


def test_release_needs_exactly_one_form() -> None:
    client = ResizeClient.from_env({"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"})
    with pytest.raises(ValueError, match="exactly one"):
        client.release(count=1, task_ids=[3])
    with pytest.raises(ValueError, match="exactly one"):
        client.release()


def test_an_unknown_option_is_refused_before_any_request() -> None:
    client = ResizeClient.from_env({"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"})
    with pytest.raises(TypeError, match="'notify'"):
        client.grow(1, notify="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'waits'"):
        client.release(count=1, waits=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'grace'"):
        client.set_target(2, grace=1.0)  # type: ignore[call-arg]


class _Recorder:
    """A client that records what the in-job API sends and answers a settled job."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        self.calls.append((method, path, body))
        return {
            "job_id": "7",
            "phase": "IDLE",
            "version": 1,
            "min_tasks": 1,
            "max_tasks": 8,
            "tasks": [{"id": 0, "host": "a"}],
        }


def test_grow_and_release_send_the_options_they_share() -> None:
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    client.grow(2, 4, cancel_pending=True, notify_cmd="veto.sh")
    client.grow(3)
    client.release(count=1, no_notify=True)
    posts = [(path, body) for method, path, body in recorder.calls if method == "POST"]
    assert posts == [
        (
            "/v1/jobs/7/resize/grow",
            {
                "tasks": 4,
                "min_tasks": 2,
                "cancel_pending": True,
                "no_notify": False,
                "notify_cmd": "veto.sh",
            },
        ),
        (
            "/v1/jobs/7/resize/grow",
            {"tasks": 3, "min_tasks": 3, "cancel_pending": False, "no_notify": False},
        ),
        (
            "/v1/jobs/7/resize/release",
            {"cancel_pending": False, "no_notify": True, "count": 1},
        ),
    ]


def test_grow_with_wait_ready_and_ready_send_what_the_routes_take() -> None:
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    client.grow(2, wait_ready=True, ready_timeout=30)
    client.ready(3)
    posts = [(path, body) for method, path, body in recorder.calls if method == "POST"]
    assert posts == [
        (
            "/v1/jobs/7/resize/grow",
            {
                "tasks": 2,
                "min_tasks": 2,
                "cancel_pending": False,
                "no_notify": False,
                "wait_ready": True,
                "ready_timeout": 30,
            },
        ),
        ("/v1/jobs/7/tasks/3/ready", None),
    ]
    with pytest.raises(TypeError, match="'wait_ready'"):
        client.release(count=1, wait_ready=True)  # type: ignore[call-arg]


def test_ready_without_a_task_id_is_the_calling_task(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    monkeypatch.setenv("XCE_TASK_ID", "5")
    client.ready()
    assert recorder.calls[-1][:2] == ("POST", "/v1/jobs/7/tasks/5/ready")
    monkeypatch.delenv("XCE_TASK_ID")
    with pytest.raises(RuntimeError, match="XCE_TASK_ID is not set"):
        client.ready()
    for text in ("abc", " 1", "1.0", "-1"):
        monkeypatch.setenv("XCE_TASK_ID", text)
        with pytest.raises(RuntimeError, match=r"^XCE_TASK_ID is not a task id .*: '"):
            client.ready()
    monkeypatch.setenv("XCE_TASK_ID", "")
    with pytest.raises(RuntimeError, match="XCE_TASK_ID is not set"):
        client.ready()
    assert recorder.calls[-1][:2] == ("POST", "/v1/jobs/7/tasks/5/ready")  # nothing since


def test_unreachable_controller_names_the_url() -> None:
    from xce_resize_plugin.errors import Unreachable

    client = ResizeClient.from_env({"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"})
    with pytest.raises(Unreachable, match=r"127\.0\.0\.1:9"):
        client.allocation()


def test_allocation_from_json() -> None:
    alloc = Allocation.from_json(
        {
            "job_id": "7",
            "phase": "IDLE",
            "version": 2,
            "min_tasks": 1,
            "max_tasks": 8,
            "tasks": [{"id": 0, "host": "a"}, {"id": 3, "host": "b"}, {"id": 4, "host": "a"}],
            "pending": None,
            "in_flight": None,
        }
    )
    assert alloc.hosts == {"a": 2, "b": 1} and alloc.size == 3 and alloc.settled


class _Events:
    """A client that answers the events route from a script of polls, recording them."""

    def __init__(self, polls: list[list[dict[str, Any]]]) -> None:
        self.polls = polls
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        self.calls.append((method, path, body))
        if path.startswith("/v1/jobs/7/events"):
            return self.polls.pop(0)
        return {"job_id": "7", "phase": "SHRINK_STOPPING", "version": 1, "min_tasks": 1,
                "max_tasks": 8, "tasks": [{"id": 0, "host": "a"}]}  # fmt: skip


def test_events_poll_from_the_cursor_until_the_job_ends() -> None:
    """events() long-polls after the last seq it yielded and stops after job_ended;
    release sends grace only when given; drained sends the ids."""
    polls = [
        [{"seq": 1, "type": "release_coming", "task_ids": [3], "deadline": 9.0}],
        [],
        [{"seq": 2, "type": "tasks_exited", "task_ids": [3]}, {"seq": 3, "type": "job_ended"}],
    ]
    recorder = _Events(polls)
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    assert [e["seq"] for e in client.events(after=0)] == [1, 2, 3]
    paths = [path.split("&")[0] for _, path, _ in recorder.calls]
    # The poll that found nothing: the job's state is looked at (it runs on).
    state = "/v1/jobs/7/resize/wait?version=0"
    assert paths == [*(f"/v1/jobs/7/events?after={n}" for n in (0, 1)), state, paths[3]]
    assert paths[3] == "/v1/jobs/7/events?after=1"
    recorder.calls.clear()
    client.release(task_ids=[3], grace=12.5)
    client.release(task_ids=[3])
    client.drained([3])
    posts = [(path, body) for method, path, body in recorder.calls if method == "POST"]
    assert posts[0][1]["grace"] == 12.5 and "grace" not in posts[1][1]
    assert posts[2] == ("/v1/jobs/7/resize/drained", {"task_ids": [3]})


def test_a_target_and_if_version_send_what_the_routes_take() -> None:
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    client.set_target(4, release_prefer=[3, 2])
    client.clear_target()
    client.release(task_ids=[3], if_version=1)
    assert [(m, p, b) for m, p, b in recorder.calls if m != "GET"] == [
        ("PUT", "/v1/jobs/7/resize/target", {"tasks": 4, "release_prefer": [3, 2]}),
        ("DELETE", "/v1/jobs/7/resize/target", None),
        (
            "POST",
            "/v1/jobs/7/resize/release",
            {"cancel_pending": False, "no_notify": False, "if_version": 1, "task_ids": [3]},
        ),
    ]
    # The answer has no target: set_target(wait=True) has nothing to wait for.
    assert client.set_target(4, wait=True).target is None


class _Waits:
    """A controller's wait route, simulated: a long poll answers at once when the poll
    ends with a change (``changes``: the answers still to give), else after its whole
    ``timeout`` with the job as it is (settled at version 1)."""

    def __init__(self, changes: list[dict[str, Any]]) -> None:
        self.changes = changes
        self.polls = 0

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        doc = {"job_id": "7", "phase": "IDLE", "version": 1, "min_tasks": 1, "max_tasks": 8,
               "tasks": [{"id": 0, "host": "a"}], "done": False, "job_state": "RUN"}  # fmt: skip
        if "/resize/wait?" in path:
            self.polls += 1
            if self.changes:
                return {**doc, **self.changes.pop(0)}
            time.sleep(float(path.rsplit("timeout=", 1)[1]))
        return doc


def test_wait_polls_again_until_its_timeout_when_nothing_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long poll that ends with nothing changed (its own timeout, shorter than the
    caller's) is not the end of the wait: the caller's timeout is."""
    monkeypatch.setattr(protocol, "MAX_POLL", 0.2)
    waits = _Waits([])
    start = time.monotonic()
    alloc = ResizeClient("7", waits).wait(after_version=1, timeout=1.0)  # type: ignore[arg-type]
    assert alloc.version == 1 and time.monotonic() - start >= 1.0 and waits.polls >= 5
    # A change that ends in a poll (committed, or failed and nothing pending) ends it.
    for change in ({"version": 2, "done": True}, {"phase": "IDLE"}):
        waits = _Waits([{"pending": {"min": 1, "max": 1}}, change])
        start = time.monotonic()
        ResizeClient("7", waits).wait(after_version=1, timeout=5.0)  # type: ignore[arg-type]
        assert waits.polls == 2 and time.monotonic() - start < 0.5
    # A grow that was given up before the first poll: its wait ends at that poll.
    waits = _Waits([])
    monkeypatch.setattr(protocol, "MAX_POLL", 0.5)
    start = time.monotonic()
    ResizeClient("7", waits).grow(1, wait=True, timeout=5.0)  # type: ignore[arg-type]
    assert waits.polls == 1 and time.monotonic() - start < 1.5


class _Busy:
    """A transport refused ``busy`` times as a full server refuses, then answering."""

    def __init__(self, refusal: tuple[str, int], busy: int) -> None:
        self.refusal, self.busy, self.calls = refusal, busy, 0

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        from xce_resize_plugin.rest.client import RemoteError

        self.calls += 1
        if self.calls <= self.busy:
            code, status = self.refusal
            raise RemoteError(code, "busy", status)
        return {"key": "k", "value": "v", "version": 1}


@pytest.mark.parametrize(
    "refusal", [("XCE_TOO_MANY_REQUESTS", 429), ("HTTP_503", 503)], ids=["429", "plain-503"]
)
def test_a_busy_server_is_asked_again(
    refusal: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's requests at their limit (429), or the server out of connections (its
    plain 503): nothing was done, so the call asks again after a pause."""
    monkeypatch.setattr(protocol, "BUSY_WAIT", 0.001)
    transport = _Busy(refusal, 3)
    assert ResizeClient("7", transport).get("k") == "v"
    assert transport.calls == 4


def test_a_stopping_controller_or_a_refusal_is_not_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from xce_resize_plugin.rest.client import RemoteError

    monkeypatch.setattr(protocol, "BUSY_WAIT", 0.001)
    for refusal in (("XCE_CONTROLLER_STOPPING", 503), ("LSBE_NO_JOB", 404)):
        transport = _Busy(refusal, 1)
        with pytest.raises(RemoteError):
            ResizeClient("7", transport).get("k")
        assert transport.calls == 1
    transport = _Busy(("HTTP_503", 503), protocol.BUSY_RETRIES + 1)
    with pytest.raises(RemoteError):
        ResizeClient("7", transport).get("k")
    assert transport.calls == protocol.BUSY_RETRIES + 1


class _Refused:
    """A transport that refuses the first request with the given plain 503."""

    def __init__(self, unprocessed: bool) -> None:
        self.unprocessed, self.calls = unprocessed, 0

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        from xce_resize_plugin.rest.client import RemoteError

        self.calls += 1
        if self.calls == 1:
            raise RemoteError("HTTP_503", "busy", 503, unprocessed=self.unprocessed)
        return _allocation_doc()


def _allocation_doc() -> dict[str, Any]:
    return {
        "job_id": "7",
        "phase": "IDLE",
        "version": 1,
        "tasks": [{"id": 0, "host": "h1"}],
        "min_tasks": 1,
        "max_tasks": 4,
    }


def test_a_plain_503_is_asked_again_only_when_nothing_can_have_been_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our servers' plain 503 comes before the application sees the request: asked
    again. Another plain 503 (a proxy's, perhaps after it forwarded the request) is
    asked again for a GET, and is the answer of a grow, which must not be sent twice."""
    from xce_resize_plugin.rest.client import RemoteError

    monkeypatch.setattr(protocol, "BUSY_WAIT", 0.001)
    transport = _Refused(unprocessed=True)
    ResizeClient("7", transport).grow(1)
    assert transport.calls == 3  # the allocation (refused, asked again), then the grow
    transport = _Refused(unprocessed=False)
    assert ResizeClient("7", transport).allocation().version == 1 and transport.calls == 2
    # The grow's own POST refused by something else than our servers: the answer.
    transport = _Refused(unprocessed=False)
    client = ResizeClient("7", transport)
    transport.calls = -1  # the allocation passes; the grow's POST is the first refused
    with pytest.raises(RemoteError) as refused:
        client.grow(1)
    assert refused.value.http_status == 503 and transport.calls == 1


@pytest.mark.parametrize(
    ("status", "body", "unprocessed"),
    [
        (503, b"Service Unavailable", True),
        (503, b"Service Unavailable\n", True),
        (503, b"<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>", False),
        (503, b"", False),
        (502, b"Service Unavailable", False),
    ],
)
def test_our_servers_plain_503_is_told_from_others(
    status: int, body: bytes, unprocessed: bool
) -> None:
    from xce_resize_plugin.rest.client import remote_error

    assert remote_error(status, body, "x").unprocessed is unprocessed


def test_the_plain_503s_our_servers_send_are_the_ones_told_unprocessed() -> None:
    """uvicorn's answer at limit_concurrency and the live servers' at accept() have the
    body the clients look for (an upgrade of uvicorn that changed it fails here)."""
    import asyncio

    from uvicorn.protocols.http.flow_control import service_unavailable

    from xce_resize_plugin.controllers.live.fd_limits import REFUSAL
    from xce_resize_plugin.rest.client import UNPROCESSED_503

    sent: list[dict[str, Any]] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    asyncio.run(service_unavailable({"type": "http"}, receive, send))
    assert sent[0]["status"] == 503 and sent[1]["body"] == UNPROCESSED_503
    assert REFUSAL.startswith(b"HTTP/1.1 503 ") and REFUSAL.endswith(b"\r\n\r\n" + UNPROCESSED_503)


class _AfterBusy:
    """A transport refused once as busy with the given ``Retry-After``, then answering."""

    def __init__(self, retry_after: int | None) -> None:
        self.retry_after, self.calls = retry_after, 0

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        from xce_resize_plugin.rest.client import RemoteError

        self.calls += 1
        if self.calls == 1:
            raise RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=self.retry_after)
        return {"key": "k", "value": "v", "version": 1}


@pytest.mark.parametrize(
    ("retry_after", "waited"),
    [(None, 1.0), (0, 1.0), (1, 1.0), (7, 7.0), (30, 30.0), (3600, 30.0)],
)
def test_a_busy_refusal_waits_its_retry_after_within_bounds(
    retry_after: int | None, waited: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is the answer's Retry-After, kept between BUSY_WAIT and BUSY_WAIT_MAX (a
    proxy's 0 would have a large job's tasks hammer it, an hour would hold the call),
    and lengthened by up to BUSY_SPREAD of it, at random, within BUSY_WAIT_MAX."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    transport = _AfterBusy(retry_after)
    assert ResizeClient("7", transport).get("k") == "v"
    assert len(slept) == 1 and transport.calls == 2
    assert waited <= slept[0] <= min(waited * (1 + protocol.BUSY_SPREAD), protocol.BUSY_WAIT_MAX)


def test_tasks_refused_together_do_not_come_back_together() -> None:
    """The waits of refusals with the same Retry-After are spread: a large job's tasks
    refused in one instant come back over half a second, not in one instant again."""
    busy = protocol.RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=1)
    waits = []
    for _ in range(50):
        exchange = protocol.Exchange(iter(()))
        waits.append(exchange.refused(busy))
    assert all(1.0 <= w < 1.5 for w in waits), waits
    assert max(waits) - min(waits) > 0.2, waits


@pytest.mark.parametrize(
    ("header", "read"),
    [
        ("5", 5),
        (" 12 ", 12),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
        ("-1", None),
        ("1.5", None),
        ("\uff15", None),
        (None, None),
    ],
)
def test_retry_after_is_read_from_a_refusal_as_whole_seconds(
    header: str | None, read: int | None
) -> None:
    from xce_resize_plugin.rest.client import remote_error

    error = remote_error(429, b'{"code": "XCE_TOO_MANY_REQUESTS"}', "Too Many", header)
    assert error.retry_after == read and error.code == "XCE_TOO_MANY_REQUESTS"


class _SlowGiveUp:
    """A controller whose wait gives up a change right at the poll's end (a grow
    cancelled as the poll ran out), with or without saying so (``gave_up``)."""

    def __init__(self, says: bool) -> None:
        self.says, self.waits = says, 0

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        doc: dict[str, Any] = {
            "job_id": "7",
            "phase": "IDLE",
            "version": 3,
            "tasks": [{"id": 0, "host": "h1"}],
            "min_tasks": 1,
            "max_tasks": 4,
            "pending": None,
            "in_flight": None,
        }
        if "/wait?" in path:
            self.waits += 1
            time.sleep(0.3)  # the whole poll
            doc.update(done=False, job_state="RUN")
            if self.says:
                doc["gave_up"] = True
        return doc


@pytest.mark.parametrize("says", [True, False], ids=["gave_up", "older controller"])
def test_wait_answers_a_change_given_up_at_the_polls_end(
    says: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The elapsed time cannot tell a given-up change from a poll that ran out when the
    two coincide: with ``gave_up`` the wait answers at once, without it (a controller
    that does not send it) at its timeout, one poll later. A wait that has reached its
    timeout answers without another poll."""
    monkeypatch.setattr(protocol, "MAX_POLL", 0.3)
    transport = _SlowGiveUp(says)
    ResizeClient("7", transport).wait(after_version=3, timeout=0.6)
    assert transport.waits == (1 if says else 2)
    transport = _SlowGiveUp(says)
    ResizeClient("7", transport).wait(after_version=3, timeout=0.3)
    assert transport.waits == 1


def test_busy_retries_are_counted_per_request() -> None:
    """A call of many requests, each refused once as busy: the call goes on (the
    retries were counted across the whole call, and it failed at the 60th)."""
    exchange = protocol.Exchange(_many_requests(protocol.BUSY_RETRIES + 5))
    from xce_resize_plugin.rest.client import RemoteError

    sent = 0
    while (request := exchange.next_request()) is not None:
        sent += 1
        if sent % 2:
            assert exchange.refused(RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429)) > 0
        else:
            exchange.answered(request.path)
    assert exchange.result == protocol.BUSY_RETRIES + 5
    assert sent == 2 * (protocol.BUSY_RETRIES + 5)


def _many_requests(n: int) -> protocol.Steps[int]:
    for i in range(n):
        yield protocol.Request("GET", f"/{i}")
    return n


class _Clock:
    """``time.monotonic`` and ``time.sleep`` of a clock that moves only when slept."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _BusyFor:
    """A transport that refuses the first ``busy`` requests as busy (429,
    ``Retry-After: 1``), then answers with ``answer``."""

    def __init__(self, busy: int, answer: Any) -> None:
        self.busy, self.answer = busy, answer
        self.paths: list[str] = []

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
        from xce_resize_plugin.rest.client import RemoteError

        self.paths.append(path)
        if len(self.paths) <= self.busy:
            raise RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=1)
        return self.answer


def test_a_long_poll_refused_as_busy_is_asked_again_for_the_time_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each retry of a long poll asks the controller to wait only the time then left,
    none once the call's timeout has passed: a call that waits answers at its timeout,
    or as soon as the controller answers again if it was busy then (before, each retry
    asked for the whole wait again, a full timeout after the busy spell)."""
    monkeypatch.setattr(protocol, "BUSY_SPREAD", 0.0)  # exact pauses (spread: above)
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    transport = _BusyFor(4, {"key": "k", "value": "v", "version": 1})
    assert ResizeClient("7", transport).get("k", wait=2.5) == "v"  # type: ignore[arg-type]
    assert [p.rsplit("?", 1)[1] for p in transport.paths] == [
        "wait=2.500",
        "wait=1.500",
        "wait=0.500",
        "wait=0.000",
        "wait=0.000",
    ]
    assert clock.now == 1004.0  # the four pauses the controller asked for, no poll more

    # The same for the allocation's wait: the poll's own timeout shrinks with it.
    settled = {**_allocation_doc(), "version": 4, "done": True, "job_state": "RUN"}
    transport = _BusyFor(2, settled)
    alloc = ResizeClient("7", transport).wait(after_version=3, timeout=1.5)  # type: ignore[arg-type]
    assert alloc.version == 4
    assert [p.rsplit("timeout=", 1)[1] for p in transport.paths] == ["1.500", "0.500", "0.000"]


def test_a_request_that_does_not_wait_is_asked_again_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a wait there is no deadline: a busy refusal is retried up to
    BUSY_RETRIES times, the same request each time."""
    from xce_resize_plugin.rest.client import RemoteError

    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    transport = _BusyFor(protocol.BUSY_RETRIES + 1, None)
    with pytest.raises(RemoteError):
        ResizeClient("7", transport).get("k")  # type: ignore[arg-type]
    assert len(transport.paths) == protocol.BUSY_RETRIES + 1
    assert set(transport.paths) == {"/v1/jobs/7/kv/k?wait=0.000"}


def test_a_retried_poll_that_ends_early_is_read_as_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A controller that does not say ``gave_up`` is judged by the time its poll took:
    the retried poll's own send and length, not the first's (with a pause between
    them, a change given up during the retried poll read as a poll that ran out, and
    the wait went on to its whole timeout)."""
    monkeypatch.setattr(protocol, "BUSY_SPREAD", 0.0)  # exact pauses (spread: above)
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    monkeypatch.setattr(protocol, "MAX_POLL", 2.0)
    settled = {**_allocation_doc(), "version": 3, "done": False, "job_state": "RUN"}

    class GivesUpSoon(_BusyFor):
        def call(self, method: str, path: str, body: Any = None, timeout: float = 0.0) -> Any:
            answer = super().call(method, path, body, timeout)
            clock.sleep(1.5)  # the retried poll (2 s asked) ends early: given up
            return answer

    transport = GivesUpSoon(1, settled)
    ResizeClient("7", transport).wait(after_version=3, timeout=10.0)  # type: ignore[arg-type]
    assert len(transport.paths) == 2 and clock.now == 1002.5


_BAD_SECONDS = [
    ("5", TypeError),
    (True, TypeError),
    ([1], TypeError),
    (float("nan"), ValueError),
    (float("inf"), ValueError),
    (-1, ValueError),
    (10**400, ValueError),
]


@pytest.mark.parametrize(("value", "error"), _BAD_SECONDS, ids=lambda v: repr(v)[:12])
def test_a_bad_timeout_or_wait_is_refused_before_any_request(
    value: Any, error: type[Exception]
) -> None:
    """A string timeout was sent on after the change was applied (the grow done, the
    call reported as "Cannot reach the controller"); NaN waited for ever."""
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    calls: list[tuple[str, Any]] = [
        ("timeout", lambda: client.grow(1, wait=True, timeout=value)),
        ("timeout", lambda: client.release(count=1, wait=True, timeout=value)),
        ("timeout", lambda: client.set_target(1, wait=True, timeout=value)),
        ("timeout", lambda: client.wait(timeout=value)),
        ("timeout", lambda: client.wait(1, timeout=value)),
        ("timeout", lambda: list(client.events(timeout=value))),
        ("wait", lambda: client.get("k", wait=value)),
    ]
    for name, call in calls:
        with pytest.raises(error, match=f"^{name} must be"):
            call()
    assert recorder.calls == []


def test_a_bad_wait_flag_or_version_is_refused_before_any_request() -> None:
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^wait must be True or False, got 'yes'"):
        client.grow(1, wait="yes")  # type: ignore[typeddict-item]
    with pytest.raises(TypeError, match=r"^wait must be True or False"):
        client.set_target(1, wait=1)  # type: ignore[typeddict-item]
    with pytest.raises(TypeError, match=r"^after_version must be an int"):
        client.wait("1&timeout=0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^after_version must be 0 or more"):
        client.wait(-1)
    assert recorder.calls == []


def test_timeout_none_is_no_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for events(timeout=None): each poll asks for the longest poll, and the call
    ends with its outcome (was a TypeError, after the change was applied)."""
    monkeypatch.setattr(protocol, "MAX_POLL", 0.2)
    waits = _Waits([{"pending": {"min": 1, "max": 1}}, {"version": 2, "done": True}])
    client = ResizeClient("7", waits)  # type: ignore[arg-type]
    assert client.grow(1, wait=True, timeout=None).version == 2
    waits.changes = [{"version": 2, "done": True}]
    assert client.wait(1, timeout=None).version == 2
    recorder = _Recorder()
    client = ResizeClient("7", recorder)  # type: ignore[arg-type]
    # The answer has no target: reached at once.
    assert client.set_target(1, wait=True, timeout=None).version == 1
