"""The live controller's TOML configuration (documented in docs/live-controller.md).

::

    [controller]
    listen = "127.0.0.1:6820"   # loopback only; port 0: any free port
    state_dir = "state"         # relative to this file
    # url = "http://127.0.0.1:6820"   XCE_CONTROLLER_URL given to tasks (default: listen)
    # manage_workers = true     start one worker agent per host (false: start them yourself)
    # kill_grace = 10.0         SIGTERM -> SIGKILL seconds when a job ends or is killed
    # worker_timeout = 10.0     seconds a new worker agent may take to come up
    # agent_timeout = 30.0      seconds a running agent may go unheard before its host fails
    # header_timeout = 10.0     seconds a client has to send a request's headers
    # body_timeout = 30.0       seconds a client has to send a request's body
    # record = "run.jsonl"      record this run's inputs for replay (relative to this file)
    # verify_journal = true     check every record's CRC of the plugin's journal at start
    # single_user = false       true: a personal controller, every job runs as its user
    # metrics_token = "sha256:<hex digest>"   may read GET /metrics (and nothing else)
    # request_limit = 256       requests one user may have in progress at once
    # finished_job_keep = 3600  seconds a finished job is kept after its end (0: dropped at once)
    # finished_job_max = 1000   each user's finished jobs kept at most (the earliest go first)

    [cluster]
    hosts = { hostA = 4, hostB = 4 }

    [users]
    admins = ["root"]
    tokens = { alice = "a-long-random-string", root = "sha256:<hex digest>" }

    [limits]
    user_slots = { alice = 8 }
    # max_pend_jobs = 10000     each user's pending jobs at most (0: no threshold)
    # kv_bytes_per_user = 67108864   bytes of key-value values a user's jobs hold at most

    [worker]                    # the agents (docs/live-controller.md, "Process containment")
    # containment = "auto"      "cgroup": a cgroup per task, or no agent; "proc": /proc only
    # task_pids_max = "15%"     pids.max of each task's cgroup: "max", a count, or a share

    [resize]                    # the plugin's section, the keys of docs/admin-guide.md
    stop_grace = 5

Everything is checked at load time; a mistake is a
:class:`~xce_resize_plugin.errors.ConfigError` naming the file and the key, so the
controller never starts on a half-understood configuration.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from xce_resize_plugin.controllers.live import cgroups
from xce_resize_plugin.controllers.tomlfile import IntCheck, Where, read_toml
from xce_resize_plugin.core import config as resize_config
from xce_resize_plugin.errors import ConfigError

SECTIONS = {"controller", "cluster", "users", "limits", "worker", "resize"}
CONTROLLER_KEYS = {
    "listen",
    "state_dir",
    "url",
    "manage_workers",
    "kill_grace",
    "worker_timeout",
    "agent_timeout",
    "header_timeout",
    "body_timeout",
    "record",
    "verify_journal",
    "single_user",
    "metrics_token",
    "request_limit",
    "finished_job_keep",
    "finished_job_max",
}
LIMITS_KEYS = {"user_slots", "max_pend_jobs", "kv_bytes_per_user"}
WORKER_KEYS = {"containment", "task_pids_max"}
DEFAULT_LISTEN = "127.0.0.1:6820"
#: Longest request deadline accepted (seconds): a longer one protects nothing.
MAX_REQUEST_TIMEOUT = 3600.0
#: Prefix of a token given as its SHA-256 digest rather than in clear.
SHA256 = "sha256:"
#: Who the ``metrics_token`` stands for (in log lines): it may read ``/metrics`` only.
SCRAPER = "metrics-token"
#: Requests one user may have in progress at once, unless ``request_limit`` says
#: otherwise: the REST layer's own default (``rest.http.DEFAULT_REQUEST_LIMIT``, not
#: imported: this module does not load Starlette; a unit test keeps the two equal).
DEFAULT_REQUEST_LIMIT = 256
#: The largest ``request_limit``: more requests than a server raises its descriptor
#: limit to (``fd_limits.MAX_NOFILE``) could never be in progress at once.
MAX_REQUEST_LIMIT = 65536
#: Seconds a finished job is kept after its end unless ``finished_job_keep`` says
#: otherwise: LSF's ``CLEAN_PERIOD`` default (docs/live-controller.md, "Jobs and tasks").
DEFAULT_FINISHED_JOB_KEEP = 3600.0
#: Each user's pending jobs at most, by default: a queue that deep is already days of
#: work on most machines, and every pending job is held in memory and in the store
#: (LSF's own default is no threshold; a controller open to every local user needs one).
DEFAULT_MAX_PEND_JOBS = 10_000
#: Each user's finished jobs kept at most, by default. ``max_pend_jobs`` bounds what a
#: user's queue holds, but jobs that end at once (killed while pending, or ``true``)
#: are never pending for long: without this, one user submitting and killing in a
#: loop filled the controller's memory and store for ``finished_job_keep`` seconds.
DEFAULT_FINISHED_JOB_MAX = 1000
#: The largest ``finished_job_max``.
MAX_FINISHED_JOB_MAX = 10_000_000
#: Bytes of key-value values (as stored: JSON-escaped) one user's jobs may hold at once,
#: by default: 64 MiB. Each job holds at most 64 values of 64 KiB (docs/in-job-api.md,
#: "Key-value store"), but the controller keeps every value in memory as well as in its
#: store, and without a bound per user one user's jobs made it hold gigabytes.
DEFAULT_KV_BYTES_PER_USER = 64 * 1024 * 1024
#: The largest ``kv_bytes_per_user`` (1 TiB): beyond, a value in bits or a typo.
MAX_KV_BYTES_PER_USER = 1 << 40
#: The longest ``finished_job_keep``: a year. Longer is a mistake (a value in ms?), and
#: would keep every job's record for ever, which the setting is there to prevent.
MAX_FINISHED_JOB_KEEP = 365 * 86400.0


@frozen
class UserToken:
    """One user's token: in clear, or as ``sha256:<hex>`` of the token."""

    user: str
    secret: str

    @property
    def digest(self) -> str:
        """The token's SHA-256 in lower-case hex, however the configuration gives it:
        two entries of one token, one in clear and one hashed, have the same."""
        if self.secret.startswith(SHA256):
            return self.secret[len(SHA256) :].lower()
        return hashlib.sha256(self.secret.encode()).hexdigest()

    def matches(self, token: str) -> bool:
        if self.secret.startswith(SHA256):
            digest = hashlib.sha256(token.encode()).hexdigest()
            return hmac.compare_digest(digest, self.secret[len(SHA256) :].lower())
        return hmac.compare_digest(token.encode(), self.secret.encode())


@frozen
class LiveConfig:
    """A checked configuration. ``path`` is the file it came from (or ``None``)."""

    state_dir: Path
    hosts: tuple[tuple[str, int], ...]
    listen_host: str = "127.0.0.1"
    listen_port: int = 6820
    url: str | None = None
    manage_workers: bool = True
    kill_grace: float = 10.0
    worker_timeout: float = 10.0
    #: Seconds a running agent may go unheard (no heartbeat) before its host fails.
    agent_timeout: float = 30.0
    #: Seconds a client has to send a request's headers (the controller's server and
    #: the agents it starts), then its body (the controller's routes).
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    admins: frozenset[str] = frozenset()
    tokens: tuple[UserToken, ...] = ()
    user_slots: Mapping[str, int] = field(factory=dict)
    resize: Mapping[str, Any] = field(factory=dict)
    path: Path | None = None
    #: Where this run's recording is written (``None``: not recorded); see
    #: :mod:`.recorder`.
    record: Path | None = None
    #: Check every record's CRC of the plugin's journal at start (docs/performance.md
    #: gives the cost per million facts).
    verify_journal: bool = True
    #: A personal controller: every job runs as the controller's own user, whoever
    #: submitted it (otherwise a job runs as its owner's account, or is refused:
    #: :func:`~.submission.job_account`).
    single_user: bool = False
    #: The scrape token: it may read ``GET /metrics`` and nothing else (``None``: only
    #: administrators may).
    metrics_token: UserToken | None = None
    #: Requests one user (their jobs' tokens included) may have in progress at once
    #: (:func:`xce_resize_plugin.rest.http.set_request_limit`).
    request_limit: int = DEFAULT_REQUEST_LIMIT
    #: Seconds a finished job (DONE or EXIT) is kept after its end, then dropped from
    #: memory, the store and the views (0: as soon as its end is recorded).
    finished_job_keep: float = DEFAULT_FINISHED_JOB_KEEP
    #: The most finished jobs kept per user: beyond, the user's earliest ended are
    #: dropped at once, as ``finished_job_keep`` would drop them later (0: none kept).
    finished_job_max: int = DEFAULT_FINISHED_JOB_MAX
    #: The most jobs one user may have pending (LSF's ``MAX_PEND_JOBS``); a submission
    #: beyond is refused. 0: no threshold.
    max_pend_jobs: int = DEFAULT_MAX_PEND_JOBS
    #: The most bytes of key-value values one user's jobs may hold at once, counted as
    #: stored (JSON-escaped); a ``PUT`` beyond is refused (413 ``XCE_KV_LIMIT``).
    kv_bytes_per_user: int = DEFAULT_KV_BYTES_PER_USER
    #: How the agents contain their tasks: ``"auto"`` (a cgroup per task where they
    #: can make cgroups, else the ``/proc`` tracking), ``"cgroup"`` (or the agent does
    #: not start) or ``"proc"`` (docs/live-controller.md, "Process containment").
    containment: str = "auto"
    #: Each task's ``pids.max``: ``"max"``, a number of pids, or a share of the host's
    #: (``"15%"``), where a pids controller is there.
    task_pids_max: str | int = cgroups.DEFAULT_PIDS_MAX

    @property
    def controller_url(self) -> str:
        """``XCE_CONTROLLER_URL`` as tasks and notification commands see it."""
        return self.url or f"http://{self.listen_host}:{self.listen_port}"


def load(path: Path | str) -> LiveConfig:
    """Read and check a configuration file."""
    path = Path(path)
    return parse(read_toml(path), path)


def parse(data: Mapping[str, Any], path: Path) -> LiveConfig:
    """Check a decoded configuration; relative paths are taken from ``path``'s directory."""
    where = Where(path)
    base = path.parent
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise where.error(unknown[0], f"unknown section (known: {', '.join(sorted(SECTIONS))})")
    ctl = where.section(data, "controller", CONTROLLER_KEYS)
    host, port = parse_listen(ctl.get("listen", DEFAULT_LISTEN), where)
    # Keyword arguments are evaluated in the order written: the keys are checked in the
    # order of the example in the module docstring (the first mistake is reported).
    cfg = LiveConfig(
        listen_host=host,
        listen_port=port,
        state_dir=_state_dir(where, ctl.get("state_dir"), base),
        url=_url(where, ctl.get("url")),
        manage_workers=_flag(where, "controller.manage_workers", ctl.get("manage_workers", True)),
        kill_grace=_number(where, "controller.kill_grace", ctl.get("kill_grace", 10.0)),
        worker_timeout=_number(where, "controller.worker_timeout", ctl.get("worker_timeout", 10.0)),
        agent_timeout=_deadline(where, "controller.agent_timeout", ctl.get("agent_timeout", 30.0)),
        header_timeout=_deadline(
            where, "controller.header_timeout", ctl.get("header_timeout", 10.0)
        ),
        body_timeout=_deadline(where, "controller.body_timeout", ctl.get("body_timeout", 30.0)),
        record=_record(where, ctl.get("record"), base),
        verify_journal=_flag(where, "controller.verify_journal", ctl.get("verify_journal", True)),
        single_user=_flag(where, "controller.single_user", ctl.get("single_user", False)),
        metrics_token=_metrics_token(where, ctl.get("metrics_token")),
        request_limit=_request_limit(where, ctl.get("request_limit", DEFAULT_REQUEST_LIMIT)),
        finished_job_keep=_finished_job_keep(
            where, ctl.get("finished_job_keep", DEFAULT_FINISHED_JOB_KEEP)
        ),
        finished_job_max=_finished_job_max(
            where, ctl.get("finished_job_max", DEFAULT_FINISHED_JOB_MAX)
        ),
        hosts=_hosts(where, where.section(data, "cluster", {"hosts"}).get("hosts")),
        admins=_admins(where, where.section(data, "users", {"admins", "tokens"}).get("admins", [])),
        tokens=_tokens(where, where.table(data, "users").get("tokens", {})),
        user_slots=_user_slots(where, where.section(data, "limits", LIMITS_KEYS)),
        max_pend_jobs=_at_least(where, 0)(
            "limits.max_pend_jobs",
            where.table(data, "limits").get("max_pend_jobs", DEFAULT_MAX_PEND_JOBS),
        ),
        kv_bytes_per_user=_int_from(
            where,
            "limits.kv_bytes_per_user",
            where.table(data, "limits").get("kv_bytes_per_user", DEFAULT_KV_BYTES_PER_USER),
            1,
            MAX_KV_BYTES_PER_USER,
        ),
        containment=_containment(where, where.section(data, "worker", WORKER_KEYS)),
        task_pids_max=_task_pids_max(where, where.table(data, "worker")),
        resize=_resize(where, where.table(data, "resize"), path),
        path=path,
    )
    scrape = cfg.metrics_token
    for user in cfg.tokens:
        if scrape is not None and scrape.digest == user.digest:
            raise where.error("controller.metrics_token", f"same token as user {user.user}")
    return cfg


def first_unprivileged_port() -> int:
    """The lowest port any user may bind (Linux's ``ip_unprivileged_port_start``;
    1024 where the system does not say)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()
        return int(text.strip())
    except (OSError, ValueError):
        return 1024


def takeable_port(cfg: LiveConfig, euid: int, first_unprivileged: int) -> str | None:
    """The warning of a root controller for several users whose port any user may
    take: while it is down (a restart, a failover), another user's process can listen
    there, and jobs' clients, which outlive the restart, would send it their tokens.
    ``None`` when only root can take the port, or when no other user's job runs."""
    if euid != 0 or cfg.single_user or 0 < cfg.listen_port < first_unprivileged:
        return None
    if first_unprivileged <= 1:
        return (
            f"controller.listen port {cfg.listen_port} can be taken by any user's process "
            "while the controller is down, and the jobs' clients would send it their "
            "tokens: every port is open to every user here (ip_unprivileged_port_start = "
            f"{first_unprivileged}); raise it, or run the controller where it is 1024"
        )
    return (
        f"controller.listen port {cfg.listen_port} can be taken by any user's process while "
        "the controller is down, and the jobs' clients would send it their tokens: listen "
        f"on a port below {first_unprivileged}, which only root can take"
    )


def parse_listen(value: Any, where: Where | None = None) -> tuple[str, int]:
    """``"127.0.0.1:6820"`` -> ``("127.0.0.1", 6820)``; loopback addresses only.

    Port 0 asks the system for a free port when the controller binds: the controller
    then uses (and reports) the port it got.
    """

    def error(message: str) -> ConfigError:
        if where is None:
            return ConfigError(f"listen: {message}")
        return where.error("controller.listen", message)

    if not isinstance(value, str) or ":" not in value:
        raise error(f'must be "HOST:PORT", got {value!r}')
    host, _, port_text = value.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise error(f"bad port {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise error(f"port {port} out of range (0 to 65535; 0: any free port)")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        # The embedded controller is an evaluation tool: tokens travel in clear HTTP.
        raise error(f"{host} is not a loopback address (the live controller serves loopback only)")
    return host, port


def _state_dir(where: Where, value: Any, base: Path) -> Path:
    if not isinstance(value, str) or not value or "\0" in value:
        raise where.error("controller.state_dir", "missing or not a path string")
    return (base / value).resolve()


def _url(where: Where, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.startswith("http")):
        raise where.error("controller.url", f"must be an http URL, got {value!r}")
    return value


def _flag(where: Where, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise where.error(key, "must be true or false")
    return value


def _record(where: Where, value: Any, base: Path) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise where.error("controller.record", f"must be a file name, got {value!r}")
    return (base / value).resolve()


def _admins(where: Where, value: Any) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise where.error("users.admins", "must be a list of user names")
    return frozenset(value)


def _user_slots(where: Where, limits: Mapping[str, Any]) -> dict[str, int]:
    return where.int_map("limits.user_slots", limits.get("user_slots", {}), _at_least(where, 0))


def _resize(where: Where, table: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The plugin's ``[resize]`` section, its policy files taken from the file's directory."""
    resize = dict(table)
    resize_config.check(resize, where=f"{path}: [resize]")
    if "policy_files" in resize:
        resize["policy_files"] = [str((path.parent / f).resolve()) for f in resize["policy_files"]]
    return resize


def _number(where: Where, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise where.error(key, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def _deadline(where: Where, key: str, value: Any) -> float:
    """A request deadline: more than 0 (a request needs some time) and at most
    :data:`MAX_REQUEST_TIMEOUT` seconds."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_REQUEST_TIMEOUT
    ):
        raise where.error(
            key, f"must be a number of seconds > 0 and <= {MAX_REQUEST_TIMEOUT:g}, got {value!r}"
        )
    return float(value)


def _int_from(where: Where, key: str, value: Any, low: int, high: int) -> int:
    """An integer from ``low`` to ``high``, or an error naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise where.error(key, f"must be an integer from {low} to {high}, got {value!r}")
    return value


def _request_limit(where: Where, value: Any) -> int:
    """A user's requests in progress: an integer from 1 (every request would be
    refused with 0) to :data:`MAX_REQUEST_LIMIT`."""
    return _int_from(where, "controller.request_limit", value, 1, MAX_REQUEST_LIMIT)


def _finished_job_keep(where: Where, value: Any) -> float:
    """Seconds from 0 (dropped once the end is recorded) to :data:`MAX_FINISHED_JOB_KEEP`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_FINISHED_JOB_KEEP  # nan fails both comparisons
    ):
        raise where.error(
            "controller.finished_job_keep",
            f"must be a number of seconds from 0 to {MAX_FINISHED_JOB_KEEP:.0f}, got {value!r}",
        )
    return float(value)


def _finished_job_max(where: Where, value: Any) -> int:
    """Finished jobs kept per user: an integer from 0 (none) to
    :data:`MAX_FINISHED_JOB_MAX`."""
    return _int_from(where, "controller.finished_job_max", value, 0, MAX_FINISHED_JOB_MAX)


def _at_least(where: Where, minimum: int) -> IntCheck:
    def check(key: str, n: Any) -> int:
        if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
            raise where.error(key, f"must be an integer >= {minimum}, got {n!r}")
        return n

    return check


def _containment(where: Where, worker: Mapping[str, Any]) -> str:
    value = worker.get("containment", "auto")
    if value not in cgroups.MODES:
        modes = ", ".join(f'"{m}"' for m in cgroups.MODES)
        raise where.error("worker.containment", f"must be one of {modes}, not {value!r}")
    return str(value)


def _task_pids_max(where: Where, worker: Mapping[str, Any]) -> str | int:
    try:
        return cgroups.parse_pids_max(worker.get("task_pids_max", cgroups.DEFAULT_PIDS_MAX))
    except ValueError as exc:
        raise where.error("worker.task_pids_max", str(exc)) from None


def _hosts(where: Where, value: Any) -> tuple[tuple[str, int], ...]:
    hosts = where.hosts(value, _at_least(where, 1))
    for name in hosts:
        # Host names become file names under the state directory.
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise where.error(f"cluster.hosts.{name}", "host names are letters, digits, - _ .")
    return tuple(hosts.items())


def _secret(where: Where, key: str, secret: Any) -> str:
    """A token as the configuration gives it: in clear (8 characters at least) or as
    ``sha256:`` and 64 hex digits."""
    if not isinstance(secret, str) or not secret:
        raise where.error(key, "must be a non-empty string")
    if secret.startswith(SHA256):
        digest = secret[len(SHA256) :]
        if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise where.error(key, "sha256: must be followed by 64 hex digits")
    elif len(secret) < 8:
        raise where.error(key, "too short (use at least 8 characters; 32 random ones)")
    return secret


def _metrics_token(where: Where, value: Any) -> UserToken | None:
    if value is None:
        return None
    return UserToken(SCRAPER, _secret(where, "controller.metrics_token", value))


def _tokens(where: Where, value: Any) -> tuple[UserToken, ...]:
    if not isinstance(value, Mapping):
        raise where.error("users.tokens", 'must be a table of user = "token"')
    out: list[UserToken] = []
    seen: dict[str, str] = {}
    for user, secret in value.items():
        key = f"users.tokens.{user}"
        if not user:
            raise where.error(key, "a token needs a user name")
        token = UserToken(str(user), _secret(where, key, secret))
        # Compared by digest: the same token given in clear and hashed is one token,
        # and whoever holds it would be taken for the first user it matches.
        if token.digest in seen:
            raise where.error(key, f"same token as user {seen[token.digest]}")
        seen[token.digest] = str(user)
        out.append(token)
    return tuple(out)
