"""The in-job API: a running job grows and shrinks itself (elastic frameworks).

Standard library only on its import path, so any task can use it cheaply::

    from xce_resize_plugin.injob import ResizeClient

    client = ResizeClient.from_env()          # XCE_CONTROLLER_URL, XCE_JOB_ID, XCE_JOB_TOKEN
    alloc = client.allocation()               # hosts, tasks, version, pending, in flight
    done = client.grow(2, 8, wait=True)       # PMIx EXTEND: 2..8 more tasks
    client.release(count=2, wait=True)        # PMIx RELEASE: the site policy picks tasks
    client.cancel()                           # PMIx REQ_CANCEL: drop the pending grow
    client.put("scheduler", "tcp://...")      # the job's key-value store (task 0) ...
    addr = client.get("scheduler", wait=60)   # ... and the other tasks find it

The job's own token (``XCE_JOB_TOKEN``) authorises it for its own job only.
docs/in-job-api.md maps every call onto PMIx's allocation directives and LSF's
notification command.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from xce_resize_plugin.rest.client import Client, RemoteError

#: A long poll never asks the controller to hold a request longer than this.
MAX_POLL = 30.0


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
        )


class ChangeOptions(TypedDict, total=False):
    """The options every change (:meth:`ResizeClient.grow`, :meth:`ResizeClient.release`)
    takes, all by keyword.

    ``wait`` (default ``False``): return once the change is committed (or given up),
    waiting at most ``timeout`` seconds (default 60). ``cancel_pending`` (LSF's ``-c``)
    cancels the job's pending grow first; ``notify_cmd`` (``-rnc``) is the notification
    command for this change, ``no_notify`` (``-rncn``) runs none; by default the job's
    own command runs.
    """

    wait: bool
    timeout: float
    cancel_pending: bool
    notify_cmd: str | None
    no_notify: bool


class ResizeClient:
    """Resize requests for one job, from inside it (or from anywhere with a token)."""

    def __init__(self, job_id: str, client: Client) -> None:
        self.job_id = job_id
        self.client = client
        self._job = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}"
        self._base = f"{self._job}/resize"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ResizeClient:
        """Built from the task environment the controller gives every task."""
        env = os.environ if environ is None else environ
        missing = [k for k in ("XCE_JOB_ID", "XCE_CONTROLLER_URL") if not env.get(k)]
        if missing:
            raise RuntimeError(
                f"not inside an XCE job: {', '.join(missing)} not set in the environment"
            )
        token = env.get("XCE_JOB_TOKEN") or env.get("XCE_TOKEN")
        return cls(env["XCE_JOB_ID"], Client(env["XCE_CONTROLLER_URL"], token))

    # --- queries --------------------------------------------------------------------

    def allocation(self) -> Allocation:
        return Allocation.from_json(self.client.call("GET", self._base))

    def history(self) -> Mapping[str, Any]:
        """Accounting: the allocation timeline and the resize records."""
        result: Mapping[str, Any] = self.client.call("GET", f"{self._base}/history")
        return result

    def wait(self, after_version: int | None = None, timeout: float = 60.0) -> Allocation:
        """Block until the job's allocation is past ``after_version`` and settled (no
        grow pending, nothing in flight), or ``timeout`` seconds passed; return it."""
        deadline = time.monotonic() + timeout
        version = self.allocation().version - 1 if after_version is None else after_version
        while True:
            left = deadline - time.monotonic()
            poll = max(0.0, min(MAX_POLL, left))
            doc = self.client.call(
                "GET",
                f"{self._base}/wait?version={version}&timeout={poll:.3f}",
                timeout=poll + 10.0,
            )
            alloc = Allocation.from_json(doc)
            # Done, or nothing more will happen without a new request (the change failed
            # or was cancelled, or the job ended), or out of time: answer now.
            finished = doc.get("job_state") not in (None, "RUN")
            if doc.get("done") or alloc.settled or finished or left <= 0:
                return alloc

    # --- changes (PMIx EXTEND, RELEASE, REQ_CANCEL) ---------------------------------------

    def grow(
        self, min_tasks: int, max_tasks: int | None = None, **options: Unpack[ChangeOptions]
    ) -> Allocation:
        """Ask for ``min_tasks..max_tasks`` more tasks (``max_tasks`` defaults to
        ``min_tasks``). With ``wait``, return once the grow is committed (or given up)."""
        body: dict[str, Any] = {
            "tasks": max_tasks if max_tasks is not None else min_tasks,
            "min_tasks": min_tasks,
            **_change_fields(options),
        }
        return self._change("grow", body, options)

    def release(
        self,
        *,
        hosts: Sequence[str] | None = None,
        host_counts: Mapping[str, int] | None = None,
        task_ids: Sequence[int] | None = None,
        count: int | None = None,
        spec: str | None = None,
        **options: Unpack[ChangeOptions],
    ) -> Allocation:
        """Give tasks back: all of the job's tasks on ``hosts``, ``host_counts`` tasks on
        hosts, these ``task_ids``, a ``count`` chosen by the site policy, or an LSF
        ``spec``. Exactly one form. Task 0 always stays."""
        body = _change_fields(options)
        forms = {
            "hosts": None
            if hosts is None and host_counts is None
            else {**dict.fromkeys(hosts or (), None), **dict(host_counts or {})},
            "task_ids": list(task_ids) if task_ids is not None else None,
            "count": count,
            "spec": spec,
        }
        given = {k: v for k, v in forms.items() if v is not None}
        if len(given) != 1:
            raise ValueError("give exactly one of hosts/host_counts, task_ids, count, spec")
        body.update(given)
        return self._change("release", body, options)

    def cancel(self) -> Allocation:
        """Cancel the pending grow (PMIx REQ_CANCEL)."""
        self.client.call("DELETE", f"{self._base}/pending")
        return self.allocation()

    # --- the job's key-value store (rendezvous) -------------------------------------------

    def put(self, key: str, value: str) -> int:
        """Set ``key`` in the job's key-value store; return its version (how many times
        it was set). Kept across a controller failover, dropped when the job ends."""
        doc = self.client.call("PUT", self._kv(key), {"value": value})
        return int(doc["version"])

    def get(self, key: str, wait: float | None = None) -> str | None:
        """The value of ``key``; ``None`` when it is not set — after waiting up to
        ``wait`` seconds for another task to set it, when given."""
        deadline = time.monotonic() + (wait or 0.0)
        while True:
            poll = max(0.0, min(MAX_POLL, deadline - time.monotonic()))
            try:
                doc = self.client.call(
                    "GET", f"{self._kv(key)}?wait={poll:.3f}", timeout=poll + 10.0
                )
            except RemoteError as exc:
                if exc.code != "XCE_KV_NO_KEY":
                    raise
                if deadline - time.monotonic() <= 0:
                    return None
                continue
            return str(doc["value"])

    def _kv(self, key: str) -> str:
        return f"{self._job}/kv/{urllib.parse.quote(key, safe='')}"

    def _change(self, kind: str, body: Mapping[str, Any], options: ChangeOptions) -> Allocation:
        before = self.allocation().version
        doc = self.client.call("POST", f"{self._base}/{kind}", dict(body))
        if not options.get("wait", False):
            return Allocation.from_json(doc)
        return self.wait(before, options.get("timeout", 60.0))


def _change_fields(options: ChangeOptions) -> dict[str, Any]:
    """The body fields a grow and a release share (``notify_cmd`` only when given);
    refuses an option :class:`ChangeOptions` does not name, as a parameter list would."""
    unknown = options.keys() - ChangeOptions.__annotations__.keys()
    if unknown:
        raise TypeError(f"unexpected keyword argument {min(unknown)!r}")
    body: dict[str, Any] = {
        "cancel_pending": options.get("cancel_pending", False),
        "no_notify": options.get("no_notify", False),
    }
    notify_cmd = options.get("notify_cmd")
    if notify_cmd is not None:
        body["notify_cmd"] = notify_cmd
    return body
