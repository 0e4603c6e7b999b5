"""The synchronous in-job client (standard library only: urllib)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, Unpack

from xce_resize_plugin.injob.protocol import (
    Allocation,
    Exchange,
    GrowOptions,
    JobRequests,
    Pacer,
    ReleaseOptions,
    Steps,
    WaitOptions,
)
from xce_resize_plugin.rest.client import Client, RemoteError

_T = TypeVar("_T")


class Transport(Protocol):
    """What the client sends requests with (:class:`~xce_resize_plugin.rest.client.Client`)."""

    def call(
        self, method: str, path: str, body: Any = None, *, timeout: float | None = None
    ) -> Any: ...


def job_environment(environ: Mapping[str, str] | None) -> tuple[str, str, str | None]:
    """The job id, controller URL and token every task is given (``XCE_JOB_ID``,
    ``XCE_CONTROLLER_URL``, ``XCE_JOB_TOKEN``); refuses outside a job."""
    env = os.environ if environ is None else environ
    missing = [k for k in ("XCE_JOB_ID", "XCE_CONTROLLER_URL") if not env.get(k)]
    if missing:
        raise RuntimeError(
            f"not inside an XCE job: {', '.join(missing)} not set in the environment"
        )
    return (
        env["XCE_JOB_ID"],
        env["XCE_CONTROLLER_URL"],
        env.get("XCE_JOB_TOKEN") or env.get("XCE_TOKEN"),
    )


class ResizeClient:
    """Resize requests for one job, from inside it (or from anywhere with a token)."""

    def __init__(self, job_id: str, client: Transport) -> None:
        self.job_id = job_id
        self.client = client
        self._requests = JobRequests(job_id)
        self._pacer = Pacer()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ResizeClient:
        """Built from the task environment the controller gives every task."""
        job_id, url, token = job_environment(environ)
        return cls(job_id, Client(url, token))

    # --- queries --------------------------------------------------------------------

    def allocation(self) -> Allocation:
        return self._run(self._requests.allocation())

    def history(self) -> Mapping[str, Any]:
        """Accounting: the allocation timeline and the resize records."""
        return self._run(self._requests.history())

    def wait(self, after_version: int | None = None, timeout: float | None = 60.0) -> Allocation:
        """Block until the job's allocation is past ``after_version`` and settled (no
        grow pending, nothing in flight), or ``timeout`` seconds passed (``None``: no
        limit); return it.
        Without ``after_version``: the allocation once settled (at once if it is)."""
        return self._run(self._requests.wait(after_version, timeout))

    # --- changes (PMIx EXTEND, RELEASE, REQ_CANCEL) ---------------------------------------

    def grow(
        self, min_tasks: int, max_tasks: int | None = None, **options: Unpack[GrowOptions]
    ) -> Allocation:
        """Ask for ``min_tasks..max_tasks`` more tasks (``max_tasks`` defaults to
        ``min_tasks``). With ``wait``, return once the grow is committed (or given up);
        with ``wait_ready``, it is committed only once its new tasks are :meth:`ready`."""
        return self._run(self._requests.grow(min_tasks, max_tasks, options))

    def ready(self, task_id: int | None = None) -> Mapping[str, Any]:
        """Tell the controller this task (``XCE_TASK_ID``, or ``task_id``) is ready for
        work: a grow waiting for readiness is committed once its last task says so.
        Saying it again changes nothing."""
        return self._run(self._requests.ready(task_id))

    def release(self, **options: Unpack[ReleaseOptions]) -> Allocation:
        """Give tasks back: all of the job's tasks on ``hosts``, ``host_counts`` tasks on
        hosts, these ``task_ids``, a ``count`` chosen by the site policy, or an LSF
        ``spec`` (:class:`~xce_resize_plugin.injob.protocol.ReleaseOptions`). Exactly one
        form. Task 0 always stays. ``grace``: seconds the tasks may drain before they are
        stopped (default: the job's, given at submission)."""
        return self._run(self._requests.release(options))

    def cancel(self) -> Allocation:
        """Cancel the pending grow (PMIx REQ_CANCEL)."""
        return self._run(self._requests.cancel())

    # --- drain before stop and job events ------------------------------------------------

    def drained(self, task_ids: Sequence[int]) -> Allocation:
        """Say these tasks of the release being drained may be stopped now (they get
        SIGTERM once every task of the release is acknowledged, or at the deadline)."""
        return self._run(self._requests.drained(task_ids))

    def events(
        self, after: int | None = None, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """The job's events, oldest first, as they happen (long polls): each a dict with
        ``seq``, ``type`` and its fields (docs/in-job-api.md). From the event after
        ``after`` (``None``: the first); ends after ``job_ended``, once the job ended
        and no event is left, or after ``timeout`` seconds (``None``: no limit)."""
        cursor = self._requests.events(after, timeout)
        while not cursor.done:
            yield from self._run(cursor.poll())

    # --- a target size (docs/in-job-api.md, "A target size") ------------------------------

    def set_target(
        self, tasks: int, release_prefer: Sequence[int] = (), **options: Unpack[WaitOptions]
    ) -> Allocation:
        """Converge on ``tasks`` tasks: the controller grows (one grow of the missing
        tasks, placed whenever slots free) or releases (``release_prefer`` ids first,
        then by the site's release policy; never task 0) by itself, and again after
        every change and host failure, until the target is cleared or replaced by a
        manual change. Replaces the pending grow and turns autoresize off. With
        ``wait``, return once the job holds ``tasks`` and is settled, its target is
        gone, or ``timeout`` seconds passed."""
        return self._run(self._requests.set_target(tasks, release_prefer, options))

    def clear_target(self) -> Allocation:
        """Clear the target: the grow it kept pending is cancelled; the size stays."""
        return self._run(self._requests.clear_target())

    # --- the job's key-value store (rendezvous) -------------------------------------------

    def put(self, key: str, value: str) -> int:
        """Set ``key`` in the job's key-value store; return its version (how many times
        it was set). Kept across a controller failover, dropped when the job ends."""
        return self._run(self._requests.put(key, value))

    def get(self, key: str, wait: float | None = None) -> str | None:
        """The value of ``key``; ``None`` when it is not set — after waiting up to
        ``wait`` seconds for another task to set it, when given."""
        return self._run(self._requests.get(key, wait))

    def delete(self, key: str) -> bool:
        """Remove ``key`` from the job's key-value store; ``False`` when it was not
        set. Its place counts again among the job's keys; set again, its version
        starts at 1."""
        return self._run(self._requests.delete(key))

    def _run(self, steps: Steps[_T]) -> _T:
        """Send each request a call makes, and feed its answer (or refusal) back."""
        exchange = Exchange(steps, self._pacer)
        while (request := exchange.next_request()) is not None:
            if pause := exchange.pause():
                time.sleep(pause)
            try:
                exchange.answered(
                    self.client.call(
                        request.method, request.path, request.body, timeout=request.timeout
                    )
                )
            except RemoteError as exc:
                if wait := exchange.refused(exc):
                    time.sleep(wait)
        return exchange.result
