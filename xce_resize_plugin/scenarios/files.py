"""Scenario files: TOML describing a cluster, jobs and resize commands over time.

The format is documented in docs/scenarios.md. Loading checks everything up front and
raises :class:`~xce_resize_plugin.errors.ConfigError` naming the file and the key
(``jobs[2].tasks``), so a scenario never half-runs because of a typo.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from xce_resize_plugin.controllers.jobs import SUBMIT_OPTIONS, JobOptions
from xce_resize_plugin.controllers.sim.events import MAX_SECONDS
from xce_resize_plugin.controllers.tomlfile import IntCheck, Where, read_toml
from xce_resize_plugin.core import config
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.core.models import GrowHosts

SECTIONS = {"cluster", "limits", "users", "resize", "scenario", "jobs", "commands"}
#: A ``[[jobs]]`` table: the submission options every controller takes, and the
#: scenario's own (id, owner, arrival time, true run time).
JOB_KEYS = SUBMIT_OPTIONS | {"id", "user", "submit", "runtime"}
COMMAND_KEYS = {"at", "user", "bresize", "resize", "modify", "host", "target"}
#: What a ``modify`` command may change (``xce-resize modify``, ``bmod``).
MODIFY_KEYS = {"job", "autoresize"}
RESIZE_OPS = {"grow", "release", "cancel"}
#: A ``host`` command's states (docs/scenarios.md, "Host commands"): what an
#: administrator or an injected failure does to a host.
HOST_STATES = {"down", "up", "closed", "open"}
HOST_KEYS = {"name", "state", "evacuate"}
#: A ``target`` command's keys (``xce-resize target``; docs/scenarios.md).
TARGET_KEYS = {"job", "tasks", "release_prefer", "clear"}
#: The largest scenario file read, in bytes (16 MiB): some 100,000 jobs and commands,
#: far more than a run that prints its timeline is for (docs/scenarios.md). A larger
#: one (``/dev/zero`` behind the name, a generated file gone wrong) is refused before
#: it is read into memory.
MAX_SCENARIO_BYTES = 16 << 20


@frozen
class JobSpec(JobOptions):
    """A scenario's ``[[jobs]]`` entry: who, when, how many tasks for how long, and the
    submission options."""

    id: str
    user: str
    submit: float
    min_tasks: int
    max_tasks: int
    runtime: float


@frozen
class HostCommand:
    """A ``host`` command: fail a host (``down``), bring it back (``up``), close it to
    new tasks (``closed``, with ``evacuate``: ask resizable jobs to leave) or open it."""

    name: str
    state: str
    evacuate: bool = False


@frozen
class CommandSpec:
    """One command: ``argv`` (a bresize command line), ``resize`` (an API body; a
    ``modify`` command is held as one with ``op = "modify"``) or ``host`` (a host
    state change, administrators only)."""

    at: float
    user: str
    argv: tuple[str, ...] | None = None
    resize: Mapping[str, Any] | None = None
    host: HostCommand | None = None


@frozen
class Scenario:
    path: Path
    hosts: tuple[tuple[str, int], ...]
    user_slots: Mapping[str, int] = field(factory=dict)
    admins: frozenset[str] = frozenset()
    resize: Mapping[str, Any] = field(factory=dict)
    until: float | None = None
    protect_reservation: bool = True
    jobs: tuple[JobSpec, ...] = ()
    commands: tuple[CommandSpec, ...] = ()


def load(path: Path | str) -> Scenario:
    """Read and check a scenario file."""
    path = Path(path)
    return parse(read_scenario_toml(path), path)


def read_scenario_toml(path: Path) -> dict[str, Any]:
    """The TOML of a scenario file: a regular file of at most :data:`MAX_SCENARIO_BYTES`
    (a FIFO is opened without waiting for a writer, and refused), or ConfigError
    naming the file, as every TOML file is read
    (:func:`~xce_resize_plugin.controllers.tomlfile.read_toml`)."""
    return read_toml(path, MAX_SCENARIO_BYTES)


def parse(data: Mapping[str, Any], path: Path) -> Scenario:
    where = Where(path)
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise where.error(unknown[0], f"unknown section (known: {', '.join(sorted(SECTIONS))})")
    cluster = where.table(data, "cluster")
    hosts = tuple(where.hosts(cluster.get("hosts"), _ints(where)).items())
    host_names = {h for h, _ in hosts}
    limits = where.table(data, "limits")
    where.only("limits", limits, {"user_slots"})
    user_slots = where.int_map("limits.user_slots", limits.get("user_slots", {}), _ints(where, 0))
    users = where.table(data, "users")
    where.only("users", users, {"admins"})
    admins = users.get("admins", [])
    if not isinstance(admins, list) or not all(isinstance(a, str) for a in admins):
        raise where.error("users.admins", "must be a list of user names")
    resize = dict(where.table(data, "resize"))
    config.check(resize, where=f"{path}: [resize]")
    resize["policy_files"] = [
        str((path.parent / f).resolve()) for f in resize.get("policy_files", [])
    ]
    for file in resize["policy_files"]:
        if not Path(file).is_file():
            raise where.error("resize.policy_files", f"{file}: no such file")
    sc = where.table(data, "scenario")
    where.only("scenario", sc, {"until", "protect_reservation"})
    until = sc.get("until")
    if until is not None:
        until = _number(where, "scenario.until", until)
    protect = sc.get("protect_reservation", True)
    if not isinstance(protect, bool):
        raise where.error("scenario.protect_reservation", "must be true or false")
    jobs = _jobs(where, data.get("jobs", []), host_names)
    commands = _commands(where, data.get("commands", []), host_names, frozenset(admins))
    return Scenario(
        path=path,
        hosts=hosts,
        user_slots=user_slots,
        admins=frozenset(admins),
        resize=resize,
        until=until,
        protect_reservation=protect,
        jobs=jobs,
        commands=commands,
    )


def _number(where: Where, key: str, value: Any, minimum: float = 0.0) -> float:
    """A time in seconds: a number from ``minimum`` to the simulated clock's
    :data:`~xce_resize_plugin.controllers.sim.events.MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise where.error(key, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise where.error(key, f"must be a finite number, got {value!r}")
    if value < minimum:
        raise where.error(key, f"must be at least {minimum:g}, got {value!r}")
    if value > MAX_SECONDS:
        raise where.error(key, f"must be at most {MAX_SECONDS:.0e} s, got {value!r}")
    return float(value)


def _int(where: Where, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise where.error(key, f"must be at least {minimum}, got {value!r}")
    return value


def _initial(where: Where, key: str, raw: Mapping[str, Any], lo: int, hi: int) -> int | None:
    if "initial" not in raw:
        return None
    initial = _int(where, f"{key}.initial", raw["initial"])
    if not lo <= initial <= hi:
        raise where.error(f"{key}.initial", f"{initial} is outside the job's {lo},{hi}")
    return initial


def _ints(where: Where, minimum: int = 1) -> IntCheck:
    """:func:`_int` as the check of :meth:`Where.int_map`."""
    return lambda key, value: _int(where, key, value, minimum)


def _tasks(where: Where, key: str, raw: Mapping[str, Any]) -> tuple[int, int]:
    if "tasks" in raw:
        if "min_tasks" in raw or "max_tasks" in raw:
            raise where.error(key, "give tasks or min_tasks/max_tasks, not both")
        value = raw["tasks"]
        if isinstance(value, str):
            counts = [read_decimal(p.strip()) for p in value.split(",")]
            first, last = counts if len(counts) == 2 else (None, None)
            if first is None or last is None:
                raise where.error(f"{key}.tasks", f'must be N or "MIN,MAX", got {value!r}')
            lo, hi = first, last
        else:
            lo = hi = _int(where, f"{key}.tasks", value)
    else:
        hi = _int(where, f"{key}.max_tasks", raw.get("max_tasks", raw.get("min_tasks", 1)))
        lo = _int(where, f"{key}.min_tasks", raw.get("min_tasks", hi))
    if lo < 1 or lo > hi:
        raise where.error(f"{key}.tasks", f"needs 1 <= min <= max, got {lo},{hi}")
    return lo, hi


def _flags(where: Where, key: str, raw: Mapping[str, Any], lo: int, hi: int) -> tuple[bool, bool]:
    """A job's ``resizable`` and ``autoresize`` (which implies resizable and needs a
    task range to grow in, as ``bsub -ar -n MIN,MAX``)."""
    resizable = raw.get("resizable", False)
    if not isinstance(resizable, bool):
        raise where.error(f"{key}.resizable", "must be true or false")
    autoresize = raw.get("autoresize", False)
    if not isinstance(autoresize, bool):
        raise where.error(f"{key}.autoresize", "must be true or false")
    if autoresize and "resizable" in raw and not resizable:
        raise where.error(f"{key}.autoresize", "implies resizable; drop resizable = false")
    if autoresize and lo >= hi:
        raise where.error(
            f"{key}.autoresize",
            f'needs a task range tasks = "MIN,MAX" with MIN < MAX, got {lo},{hi}',
        )
    return resizable or autoresize, autoresize


def _jobs(where: Where, value: Any, host_names: set[str]) -> tuple[JobSpec, ...]:
    if not isinstance(value, list):
        raise where.error("jobs", "must be an array of tables ([[jobs]])")
    out: list[JobSpec] = []
    seen: set[str] = set()
    next_id = 101
    for i, raw in enumerate(value):
        key = f"jobs[{i}]"
        if not isinstance(raw, Mapping):
            raise where.error(key, "must be a table")
        where.only(key, raw, JOB_KEYS)
        job_id = raw.get("id", str(next_id))
        if not isinstance(job_id, str) or not job_id:
            raise where.error(f"{key}.id", f"must be a non-empty string, got {job_id!r}")
        if job_id in seen:
            raise where.error(f"{key}.id", f"job {job_id} is defined twice")
        seen.add(job_id)
        number = read_decimal(job_id)
        if number is not None:
            next_id = max(next_id, number + 1)
        user = raw.get("user")
        if not isinstance(user, str) or not user:
            raise where.error(f"{key}.user", "missing or not a string")
        lo, hi = _tasks(where, key, raw)
        grow_hosts = raw.get("grow_hosts", GrowHosts.PREFER_EXISTING.value)
        try:
            gh = GrowHosts(grow_hosts)
        except ValueError:
            known = ", ".join(g.value for g in GrowHosts)
            raise where.error(f"{key}.grow_hosts", f"must be one of {known}") from None
        notify = raw.get("notify_cmd")
        if notify is not None and not isinstance(notify, str):
            raise where.error(f"{key}.notify_cmd", "must be a string")
        resizable, autoresize = _flags(where, key, raw, lo, hi)
        alloc = None
        if "alloc" in raw:
            amap = where.int_map(f"{key}.alloc", raw["alloc"], _ints(where))
            for host in amap:
                if host not in host_names:
                    raise where.error(f"{key}.alloc.{host}", "no such host in [cluster] hosts")
            total = sum(amap.values())
            if not lo <= total <= hi:
                raise where.error(f"{key}.alloc", f"{total} tasks is outside the job's {lo},{hi}")
            alloc = tuple(amap.items())
        ptile = raw.get("ptile")
        out.append(
            JobSpec(
                id=job_id,
                user=user,
                submit=_number(where, f"{key}.submit", raw.get("submit", 0)),
                min_tasks=lo,
                max_tasks=hi,
                runtime=_number(where, f"{key}.runtime", raw.get("runtime", 3600)),
                ptile=None if ptile is None else _int(where, f"{key}.ptile", ptile),
                resizable=resizable,
                autoresize=autoresize,
                grow_hosts=gh,
                notify_cmd=notify,
                alloc=alloc,
                estimate=(
                    None
                    if "estimate" not in raw
                    else _number(where, f"{key}.estimate", raw["estimate"])
                ),
                initial=_initial(where, key, raw, lo, hi),
                release_exited=_release_exited(where, key, raw, resizable),
                grace=_number(where, f"{key}.grace", raw.get("grace", 0)),
            )
        )
    return tuple(out)


def _release_exited(where: Where, key: str, raw: Mapping[str, Any], resizable: bool) -> bool:
    value = raw.get("release_exited", False)
    if not isinstance(value, bool):
        raise where.error(f"{key}.release_exited", "must be true or false")
    if value and not resizable:
        raise where.error(f"{key}.release_exited", "needs resizable = true")
    return value


def _modify(where: Where, key: str, body: Any) -> dict[str, Any]:
    """A ``modify = { job = "101", autoresize = false }`` command, checked."""
    if not isinstance(body, Mapping):
        raise where.error(f"{key}.modify", "must be a table")
    where.only(f"{key}.modify", body, MODIFY_KEYS)
    if not isinstance(body.get("job"), str):
        raise where.error(f"{key}.modify.job", "missing or not a string")
    if not isinstance(body.get("autoresize"), bool):
        raise where.error(f"{key}.modify.autoresize", "missing or not true/false")
    return {"op": "modify", **body}


def _target(where: Where, key: str, body: Any) -> dict[str, Any]:
    """A ``target = { job = "101", tasks = 4, release_prefer = [3] }`` command (or
    ``clear = true`` instead of ``tasks``), checked; held as a resize body with
    ``op = "target"``. What the controller checks (the range, the ids) it answers."""
    if not isinstance(body, Mapping):
        raise where.error(f"{key}.target", "must be a table")
    where.only(f"{key}.target", body, TARGET_KEYS)
    if not isinstance(body.get("job"), str):
        raise where.error(f"{key}.target.job", "missing or not a string")
    clear = body.get("clear", False)
    if clear is not True and clear is not False:
        raise where.error(f"{key}.target.clear", "must be true or false")
    if clear == ("tasks" in body):
        raise where.error(f"{key}.target", "give exactly one of tasks or clear = true")
    if clear and "release_prefer" in body:
        raise where.error(f"{key}.target.release_prefer", "not with clear = true")
    return {"op": "target", **body}


def _host_command(
    where: Where, key: str, raw: Any, user: str, hosts: set[str], admins: frozenset[str]
) -> HostCommand:
    """A ``host = {name, state[, evacuate]}`` table, checked: administrators only."""
    if not isinstance(raw, Mapping):
        raise where.error(key, "must be a table")
    where.only(key, raw, HOST_KEYS)
    if user not in admins:
        raise where.error(key, f"only administrators ([users] admins) may change hosts: {user}")
    name = raw.get("name")
    if not isinstance(name, str) or name not in hosts:
        raise where.error(f"{key}.name", f"no such host in [cluster] hosts: {name!r}")
    state = raw.get("state")
    if not isinstance(state, str) or state not in HOST_STATES:  # a list is unhashable
        raise where.error(f"{key}.state", f"must be one of {', '.join(sorted(HOST_STATES))}")
    evacuate = raw.get("evacuate", False)
    if not isinstance(evacuate, bool):
        raise where.error(f"{key}.evacuate", "must be true or false")
    if evacuate and state != "closed":
        raise where.error(f"{key}.evacuate", 'only with state = "closed"')
    return HostCommand(name, str(state), evacuate)


def _commands(
    where: Where, value: Any, hosts: set[str], admins: frozenset[str]
) -> tuple[CommandSpec, ...]:
    if not isinstance(value, list):
        raise where.error("commands", "must be an array of tables ([[commands]])")
    out = []
    for i, raw in enumerate(value):
        key = f"commands[{i}]"
        if not isinstance(raw, Mapping):
            raise where.error(key, "must be a table")
        where.only(key, raw, COMMAND_KEYS)
        at = _number(where, f"{key}.at", raw.get("at", 0))
        user = raw.get("user")
        if not isinstance(user, str) or not user:
            raise where.error(f"{key}.user", "missing or not a string")
        given = [k for k in ("bresize", "resize", "modify", "host", "target") if k in raw]
        if len(given) != 1:
            raise where.error(key, "give exactly one of bresize, resize, modify, target or host")
        if given[0] == "target":
            out.append(CommandSpec(at=at, user=user, resize=_target(where, key, raw["target"])))
        elif given[0] == "host":
            host = _host_command(where, f"{key}.host", raw["host"], user, hosts, admins)
            out.append(CommandSpec(at=at, user=user, host=host))
        elif given[0] == "modify":
            out.append(CommandSpec(at=at, user=user, resize=_modify(where, key, raw["modify"])))
        elif given[0] == "bresize":
            line = raw["bresize"]
            if not isinstance(line, str):
                raise where.error(f"{key}.bresize", "must be a string")
            try:
                argv = tuple(shlex.split(line))
            except ValueError as exc:
                raise where.error(
                    f"{key}.bresize", f"cannot be split like a shell: {exc}"
                ) from None
            out.append(CommandSpec(at=at, user=user, argv=argv))
        else:
            body = raw["resize"]
            if not isinstance(body, Mapping):
                raise where.error(f"{key}.resize", "must be a table")
            op = body.get("op")
            if op not in RESIZE_OPS:
                raise where.error(
                    f"{key}.resize.op", f"must be one of {', '.join(sorted(RESIZE_OPS))}"
                )
            if not isinstance(body.get("job"), str):
                raise where.error(f"{key}.resize.job", "missing or not a string")
            out.append(CommandSpec(at=at, user=user, resize=dict(body)))
    # Commands at the same instant keep their file order (a stable sort).
    return tuple(sorted(out, key=lambda c: c.at))
