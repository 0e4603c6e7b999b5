"""The Dask integration refuses to run where it cannot work, with a message naming
why, before it touches the controller (its live behaviour: tests/e2e/live/test_live_dask.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("distributed")

from xce_resize_plugin.integrations.dask import XCECluster
from xce_resize_plugin.integrations.dask.worker import main, parse_args

JOB = {"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9", "XCE_HEAD_ADDR": "h"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({**JOB, "XCE_TASK_ID": "3"}, "runs in task 0 of a job; this is task 3"),
        ({"XCE_JOB_ID": "7", "XCE_TASK_ID": "0"}, "XCE_HEAD_ADDR not set"),
    ],
)
def test_the_cluster_outside_task_0_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        XCECluster(environ=environ)


def test_an_unreachable_controller_fails_the_start_and_leaves_nothing_running() -> None:
    from xce_resize_plugin.errors import Unreachable

    environ = {**JOB, "XCE_HEAD_ADDR": "127.0.0.1", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"}
    with pytest.raises(Unreachable, match=r"127\.0\.0\.1:9"):
        XCECluster(environ=environ)


def test_the_worker_outside_a_job_or_in_task_0_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("XCE_JOB_ID", "XCE_CONTROLLER_URL", "XCE_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--wait", "0"]) == 1
    assert "runs in a job's tasks other than task 0" in capsys.readouterr().err
    monkeypatch.setenv("XCE_TASK_ID", "2")
    assert main(["--wait", "0"]) == 1
    assert "not inside an XCE job: XCE_JOB_ID, XCE_CONTROLLER_URL" in capsys.readouterr().err


def test_the_worker_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--nthreads", "0"], ["--wait", "-1"], ["--connect-wait", "0"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        assert exit_.value.code == 2
        assert "--nthreads must be at least 1" in capsys.readouterr().err


class _EventsClient:
    """The in-job client's ``events(after)``: the job's events after ``after``."""

    def __init__(self, events: list[dict[str, object]]) -> None:
        self._events = events
        self.reads: list[int | None] = []

    async def events(self, after: int | None = None) -> AsyncIterator[dict[str, object]]:
        self.reads.append(after)
        for event in self._events:
            if after is None or int(str(event["seq"])) > after:
                yield event


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_a_refresh_that_fails_reads_its_event_again_and_announces_a_release_once(
    monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    """The controller failing over while the cluster refreshes after an event: that
    event is read again (a ``release_coming`` among them is not skipped, so its workers
    are drained rather than stopped at the deadline), and no release is announced
    twice."""
    import asyncio

    from xce_resize_plugin.errors import Unreachable
    from xce_resize_plugin.integrations.dask import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "RETRY", 0)
    stream = _EventsClient(
        [
            {"seq": 1, "type": "grow_placed"},
            {"seq": 2, "type": "release_coming", "task_ids": [0, 3, 4]},
            {"seq": 3, "type": "job_ended"},
        ]
    )
    refreshed: list[int] = []
    fail = [True]

    async def refresh() -> None:
        refreshed.append(len(refreshed))
        if len(refreshed) == failing and fail:
            fail.clear()
            raise Unreachable()

    announced: list[list[int]] = []

    asyncio.run(cluster_module.follow_job_events(stream, refresh, announced.append))  # type: ignore[arg-type]
    assert announced == [[3, 4]]
    # Read from the start, then again from the last event whose refresh succeeded.
    assert stream.reads == [None, None if failing == 1 else failing - 1]
    assert len(refreshed) == 4


def test_a_refusal_of_the_events_stops_following_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from xce_resize_plugin.integrations.dask import cluster as cluster_module
    from xce_resize_plugin.rest.client import RemoteError

    calls: list[int | None] = []

    class Client:
        @staticmethod
        async def events(after: int | None = None) -> AsyncIterator[dict[str, object]]:
            calls.append(after)
            raise RemoteError("LSBE_NO_JOB", "job ended", 404)
            yield {}  # pragma: no cover (makes this an async generator)

    async def refresh() -> None:
        raise AssertionError("no event was read")

    asyncio.run(cluster_module.follow_job_events(Client(), refresh, lambda ids: None))  # type: ignore[arg-type]
    assert calls == [None]


def test_events_refused_as_busy_are_followed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 429 that outlasted the client's own retries (the owner's requests in progress
    at their limit: a job of hundreds of workers, each following the events) changed
    nothing and will pass: the events are read again, not given up for good (outside
    releases would no longer be drained)."""
    import asyncio

    from xce_resize_plugin.integrations.dask import cluster as cluster_module
    from xce_resize_plugin.integrations.dask.sizing import transient
    from xce_resize_plugin.rest.client import RemoteError

    monkeypatch.setattr(cluster_module, "RETRY", 0)
    calls: list[int | None] = []

    class Client:
        @staticmethod
        async def events(after: int | None = None) -> AsyncIterator[dict[str, object]]:
            calls.append(after)
            if len(calls) == 1:
                raise RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=1)
            yield {"seq": 1, "type": "job_ended"}

    async def refresh() -> None:
        return None

    asyncio.run(cluster_module.follow_job_events(Client(), refresh, lambda ids: None))  # type: ignore[arg-type]
    assert calls == [None, None]
    assert not transient(RemoteError("LSBE_NO_JOB", "job ended", 404))


def _alloc(version: int, tasks: int, target: int) -> object:
    from xce_resize_plugin.injob.protocol import Allocation

    return Allocation(
        "7",
        "IDLE",
        version,
        tuple((i, "h1") for i in range(tasks)),
        1,
        8,
        target={"tasks": target, "release_prefer": []},
    )


def test_waiting_for_the_target_goes_on_through_a_busy_or_failing_over_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``wait_for_allocation`` (``JobSizer.settled``): a refusal that will pass (the
    controller busy through the client's retries, or failing over) is asked again
    until the timeout, which alone ends the wait (TimeoutError); a final refusal (the
    job ended) is raised."""
    import asyncio

    from xce_resize_plugin.errors import Unreachable
    from xce_resize_plugin.integrations.dask import sizing
    from xce_resize_plugin.rest.client import RemoteError

    monkeypatch.setattr(sizing, "RETRY", 0)

    class Client:
        def __init__(self, refusals: list[Exception]) -> None:
            self.refusals, self.waits = refusals, 0

        async def allocation(self) -> object:
            return _alloc(1, 2, 4)

        async def wait(self, after_version: int, timeout: float) -> object:
            self.waits += 1
            if self.refusals:
                raise self.refusals.pop(0)
            return _alloc(2, 4, 4)

    busy = RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=1)
    client = Client([busy, Unreachable("http://h:1")])
    sizer = sizing.JobSizer(client, _alloc(1, 2, 4))  # type: ignore[arg-type]
    assert asyncio.run(sizer.settled(5.0)).size == 4 and client.waits == 3
    ended = Client([RemoteError("LSBE_NO_JOB", "job ended", 404)])
    with pytest.raises(RemoteError):
        asyncio.run(sizing.JobSizer(ended, _alloc(1, 2, 4)).settled(5.0))  # type: ignore[arg-type]


def test_the_worker_asks_again_for_the_scheduler_through_a_busy_controller(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal that will pass is asked again within ``--wait``; any other refusal
    ends the worker with a message, not a traceback."""
    import asyncio

    from xce_resize_plugin.integrations.dask import worker
    from xce_resize_plugin.rest.client import RemoteError

    monkeypatch.setattr(worker, "RETRY", 0)
    refusals: list[RemoteError] = []
    asked: list[float | None] = []

    class Client:
        def __init__(self) -> None:
            pass

        @classmethod
        def from_env(cls, environ: object) -> Client:
            return cls()

        async def __aenter__(self) -> Client:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def get(self, key: str, wait: float | None = None) -> str:
            asked.append(wait)
            if refusals:
                raise refusals.pop(0)
            return "tcp://h:8786"

    monkeypatch.setattr(worker, "AsyncResizeClient", Client)
    refusals.append(RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=1))
    assert asyncio.run(worker.scheduler_address({}, 30.0)) == "tcp://h:8786"
    assert len(asked) == 2 and all(w is not None and 0 < w <= 30.0 for w in asked)
    refusals.append(RemoteError("LSBE_NO_JOB", "job ended", 404))
    with pytest.raises(RuntimeError, match="key-value store could not be read"):
        asyncio.run(worker.scheduler_address({}, 30.0))


def test_only_the_race_of_a_named_task_leaving_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``XCE_RESIZE_INVALID_REQUEST`` is tried again only when it is the race it may
    mean: a task the target named for release left the job before the request came
    (read again, the allocation no longer holds it). Any other (a size the controller
    refuses) is raised at the first answer, not after ten seconds of attempts."""
    import asyncio

    from xce_resize_plugin.integrations.dask import sizing
    from xce_resize_plugin.rest.client import RemoteError

    monkeypatch.setattr(sizing, "RETRY", 0)
    invalid = RemoteError("XCE_RESIZE_INVALID_REQUEST", "invalid", 400)

    class Client:
        def __init__(self, tasks_after: int) -> None:
            self.sets: list[tuple[int, list[int]]] = []
            self.reads, self.tasks_after = 0, tasks_after

        async def allocation(self) -> object:
            self.reads += 1  # 4 tasks, then (read after the refusal) tasks_after
            return _alloc(1, 4 if self.reads == 1 else self.tasks_after, 4)

        async def set_target(self, tasks: int, prefer: list[int]) -> object:
            self.sets.append((tasks, prefer))
            if len(self.sets) == 1:
                raise invalid
            return _alloc(2, tasks, tasks)

    # Task 3 left between the read and the request: read again, and it is not named.
    left = Client(tasks_after=3)
    asyncio.run(sizing.JobSizer(left, _alloc(1, 4, 4)).release([3]))  # type: ignore[arg-type]
    # (Read again once to tell the race, then by the next attempt: nothing left to name.)
    assert left.sets == [(3, [3])] and left.reads == 3
    for client, call in [
        (Client(tasks_after=4), lambda s: s.release([3])),  # still held: not the race
        (Client(tasks_after=4), lambda s: s.resize(3)),  # nothing named
    ]:
        with pytest.raises(RemoteError):
            asyncio.run(call(sizing.JobSizer(client, _alloc(1, 4, 4))))  # type: ignore[arg-type]
        assert len(client.sets) == 1
