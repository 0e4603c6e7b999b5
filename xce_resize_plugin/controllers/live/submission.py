"""A job submission to the live controller (``POST /v1/jobs``), checked.

:func:`parse_submission` checks a decoded body field by field, in the order of
:class:`Submission`'s fields, each with its own check below; the first bad field raises
:class:`~xce_resize_plugin.errors.InvalidRequest` naming it (``@ $.tasks``), so the
client learns which one to fix and nothing is submitted.

:func:`job_account` decides who a job's processes run as, or refuses the job
(:class:`SubmitRejected`) when this controller cannot run it as its owner.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from xce_resize_plugin.controllers.jobs import SUBMIT_OPTIONS, JobOptions
from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.core.models import GrowHosts
from xce_resize_plugin.core.releasespec import MAX_COUNT
from xce_resize_plugin.errors import InvalidRequest, ResizeError

#: Largest submission fields (bytes / entries), so one request cannot bloat the state.
MAX_ARGV, MAX_ENV = 256, 256
# A variable's name: printable, no blank and no "=" (a newline in a name split the
# job's environment as a shell or `env` shows it; POSIX allows any byte but "=" and
# NUL, no shell or scheduler writes such names).
_ENV_NAME = re.compile(r"[^\s=]+")
#: The keys of a body: the job options every host takes, and the job's process.
SUBMIT_KEYS = SUBMIT_OPTIONS | {"command", "env", "cwd"}


class SubmitRejected(ResizeError):
    """The host refused a job submission (bad options, a job that could never start,
    an owner it cannot run jobs as)."""

    code = "XCE_SUBMIT_REJECTED"
    message = "Job submission rejected"
    http_status = 400


def job_account(owner: str, *, single_user: bool, euid: int) -> Account:
    """Who the processes of ``owner``'s job run as, on a controller (and agents) running
    as ``euid`` — an argument, so that both cases are tested wherever the tests run.

    - ``single_user`` (a personal controller): its own user, whoever submitted.
    - root: the owner's local account, its uid, gid and groups; an owner without one
      is refused.
    - any other user: its own user, for its own jobs only; other users' jobs are
      refused (it could only run them as itself).
    """
    if single_user:
        return Account.of_uid(euid)
    if euid == 0:
        try:
            return Account.named(owner)
        except KeyError:
            raise SubmitRejected(
                f"submit: user {owner} has no local account here, and this controller "
                "runs every job as its owner (create the account; or, where every token "
                "holder may be root, set [controller] single_user = true)"
            ) from None
    own = Account.of_uid(euid)
    if owner != own.name:
        raise SubmitRejected(
            f"submit: this controller runs as {own.name}, not root: it runs only "
            f"{own.name}'s jobs, not {owner}'s (a personal controller that runs every "
            "job as its own user sets [controller] single_user = true)"
        )
    return own


@frozen
class Submission(JobOptions):
    """A checked ``POST /v1/jobs`` body: the command, the task range, the job's
    environment and working directory, and the submission options."""

    command: tuple[str, ...]
    tasks: tuple[int, int]
    env: Mapping[str, str] = {}
    cwd: str | None = None


def parse_submission(body: Any) -> Submission:
    """Check a submission body; :class:`InvalidRequest` names the field (``@ $.tasks``)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("submit: expected a JSON object")
    unknown = sorted(set(body) - SUBMIT_KEYS)
    if unknown:
        raise InvalidRequest(f"submit: unknown field @ $.{unknown[0]}")
    # Keyword arguments are evaluated in the order written: the checks run in this order.
    return Submission(
        command=_command(body.get("command")),
        tasks=_task_range(body),
        ptile=_ptile(body.get("ptile")),
        resizable=_resizable(body.get("resizable", False)),
        grow_hosts=_grow_hosts(body.get("grow_hosts", GrowHosts.PREFER_EXISTING.value)),
        notify_cmd=_notify_cmd(body.get("notify_cmd")),
        env=_env(body.get("env", {})),
        cwd=_cwd(body.get("cwd")),
        estimate=_estimate(body.get("estimate")),
        alloc=_alloc(body.get("alloc")),
        initial=_initial(body.get("initial")),
        autoresize=_autoresize(body),
        release_exited=_release_exited(body.get("release_exited", False)),
        grace=_grace(body.get("grace", 0)),
    )


def _command(value: Any) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_ARGV
        or not all(isinstance(a, str) and "\0" not in a for a in value)
    ):
        raise InvalidRequest("submit: command must be a non-empty list of strings @ $.command")
    return tuple(value)


def _task_range(body: Mapping[str, Any]) -> tuple[int, int]:
    def count(key: str, value: Any) -> int:
        # At most MAX_COUNT, as bresize's counts: 2**64 was accepted, and then no
        # journal record of the job could be written (the whole controller failed).
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
            raise InvalidRequest(
                f"submit: {key} must be an integer from 1 to {MAX_COUNT} @ $.{key}"
            )
        return value

    if "tasks" in body:
        if "min_tasks" in body or "max_tasks" in body:
            raise InvalidRequest("submit: give tasks or min_tasks/max_tasks, not both @ $.tasks")
        value = body["tasks"]
        if isinstance(value, str):
            counts = [read_decimal(p.strip()) for p in value.split(",")]
            first, last = counts if len(counts) == 2 else (None, None)
            if first is None or last is None:
                raise InvalidRequest('submit: tasks must be N or "MIN,MAX" @ $.tasks')
            lo, hi = first, last
            if hi > MAX_COUNT:
                raise InvalidRequest(f"submit: tasks above {MAX_COUNT} @ $.tasks")
        else:
            lo = hi = count("tasks", value)
    else:
        hi = count("max_tasks", body.get("max_tasks", body.get("min_tasks", 1)))
        lo = count("min_tasks", body.get("min_tasks", hi))
    if not 1 <= lo <= hi:
        raise InvalidRequest(f"submit: needs 1 <= min <= max, got {lo},{hi} @ $.tasks")
    return lo, hi


def _ptile(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidRequest("submit: ptile must be an integer @ $.ptile")
    return value


def _resizable(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest("submit: resizable must be true or false @ $.resizable")
    return value


def _autoresize(body: Mapping[str, Any]) -> bool:
    """``autoresize`` (``bsub -ar``): implies resizable, so ``"resizable": false``
    beside it is a contradiction; the task range is the plugin's check
    (``xce_job_validate``), so that every host gets the same one."""
    value = body.get("autoresize", False)
    if not isinstance(value, bool):
        raise InvalidRequest("submit: autoresize must be true or false @ $.autoresize")
    if value and body.get("resizable", True) is False:
        raise InvalidRequest(
            'submit: autoresize implies resizable; drop "resizable": false @ $.autoresize'
        )
    return value


def _release_exited(value: Any) -> bool:
    """``release_exited``: a flag; that the job is resizable is the plugin's check
    (``xce_job_validate``), as for every host."""
    if not isinstance(value, bool):
        raise InvalidRequest("submit: release_exited must be true or false @ $.release_exited")
    return value


def _grow_hosts(value: Any) -> GrowHosts:
    try:
        return GrowHosts(value)
    except ValueError:
        known = ", ".join(g.value for g in GrowHosts)
        raise InvalidRequest(f"submit: grow_hosts must be one of {known} @ $.grow_hosts") from None


def _notify_cmd(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("submit: notify_cmd must be a string @ $.notify_cmd")
    return value


def _env(value: Any) -> dict[str, str]:
    if (
        not isinstance(value, Mapping)
        or len(value) > MAX_ENV
        or not all(isinstance(k, str) and _ENV_NAME.fullmatch(k) and k.isprintable() for k in value)
        or not all(isinstance(v, str) and "\0" not in v for v in value.values())
    ):
        raise InvalidRequest(
            "submit: env must map variable names (printable, no blank or '=') to strings @ $.env"
        )
    return dict(value)


def _cwd(value: Any) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not os.path.isabs(value) or "\0" in value
    ):
        raise InvalidRequest("submit: cwd must be an absolute path @ $.cwd")
    return value


def check_cwd(cwd: str | None, account: Account, euid: int) -> None:
    """Refuse a working directory that does not exist — only when the controller runs
    as the job's own user. A controller running as root and a job running as its
    owner must not look: the answer would tell any user whether a path exists in
    directories only root may read. Such a job's tasks change directory as their owner
    and fail to start (the shell's message in ``task-N.err``) when they cannot."""
    if cwd is not None and account.uid == euid and not os.path.isdir(cwd):
        raise InvalidRequest(f"submit: no such directory {cwd} @ $.cwd")


def _estimate(value: Any) -> float | None:
    if value is None:
        return None
    # Below 1e300: float() of a larger int overflows (10**400 was a 500).
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e300:
        raise InvalidRequest("submit: estimate must be a number of seconds @ $.estimate")
    return float(value)


def _grace(value: Any) -> float:
    # Against the site's maximum: the plugin's xce_job_validate (docs/admin-guide.md).
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e300:
        raise InvalidRequest("submit: grace must be a number of seconds >= 0 @ $.grace")
    return float(value)


def _initial(value: Any) -> int | None:
    # Against the task range: the controller's own submission check (one message for
    # the scenario and the live paths).
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidRequest("submit: initial must be an integer >= 1 @ $.initial")
    return value


def _alloc(value: Any) -> tuple[tuple[str, int], ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, Mapping)
        or not value
        or not all(isinstance(h, str) for h in value)
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in value.values())
    ):
        raise InvalidRequest("submit: alloc must map host names to task counts @ $.alloc")
    return tuple(value.items())
