"""The live controller's limits on connections and requests: ``[controller]
request_limit`` (docs/live-controller.md) and what :mod:`.fd_limits` derives from the
descriptor limit; and on what it keeps: ``[controller] finished_job_keep``, the seconds
a finished job is kept after its end (docs/live-controller.md, "Configuration" and
"Jobs and tasks")."""

from __future__ import annotations

import logging
import math
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import fd_limits, settings
from xce_resize_plugin.errors import ConfigError

BASE: dict[str, Any] = {
    "controller": {"state_dir": "state"},
    "cluster": {"hosts": {"h1": 2}},
    "users": {"tokens": {"alice": "a-long-random-string"}},
}


def parse(**controller: Any) -> settings.LiveConfig:
    data = {**BASE, "controller": {**BASE["controller"], **controller}}
    return settings.parse(data, Path("/site/controller.toml"))


def test_the_request_limit_defaults_to_the_rest_layers() -> None:
    pytest.importorskip("starlette")
    from xce_resize_plugin.rest.http import DEFAULT_REQUEST_LIMIT

    assert parse().request_limit == settings.DEFAULT_REQUEST_LIMIT == DEFAULT_REQUEST_LIMIT
    assert parse(request_limit=1).request_limit == 1
    assert parse(request_limit=65536).request_limit == 65536


@pytest.mark.parametrize("value", [0, -1, 65537, 2.5, "256", True, [256]])
def test_a_bad_request_limit_is_named(value: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(request_limit=value)
    assert str(refused.value) == (
        "Configuration error: /site/controller.toml: controller.request_limit: must be "
        f"an integer from 1 to 65536, got {value!r}"
    )


def _controller(config: Path) -> subprocess.CompletedProcess[str]:
    """``xce-resize controller --config CONFIG``, run to its end (a refused start)."""
    return subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", "controller", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_a_bad_request_limit_stops_the_controller_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "controller.toml"
    config.write_text(
        '[controller]\nstate_dir = "state"\nrequest_limit = 0\n'
        "[cluster]\nhosts = { h1 = 1 }\n"
        '[users]\ntokens = { alice = "a-long-random-string" }\n'
    )
    out = _controller(config)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "controller.request_limit: must be an integer" in lines[0], lines
    assert not (tmp_path / "state").exists()


def test_a_journal_map_size_beyond_the_journals_limit_stops_the_controller_first(
    tmp_path: Path,
) -> None:
    """2**64 was a traceback from LMDB (exit 1), after the state directory, the store
    and an agent were made."""
    config = tmp_path / "controller.toml"
    config.write_text(
        '[controller]\nstate_dir = "state"\nlisten = "127.0.0.1:0"\n'
        "[cluster]\nhosts = { h1 = 1 }\n"
        '[users]\ntokens = { alice = "a-long-random-string" }\n'
        "[resize]\njournal_map_size = 18446744073709551616\n"
    )
    out = _controller(config)
    assert (out.returncode, out.stderr) == (
        2,
        f"xce-resize: Configuration error: {config}: [resize] journal_map_size must be "
        "between 1048576 and 1099511627776, got 18446744073709551616\n",
    )
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("nofile", "hosts", "reserve", "concurrency"),
    [
        (65536, 2, 72, 65536 - 144),
        (1024, 2, 72, 1024 - 144),
        (1024, 100, 256, 512),  # the reserve wanted (464) would leave too little
        (256, 1, 64, 128),
        (4, 0, 1, 2),
    ],
)
def test_connections_leave_the_reserve_free(
    nofile: int, hosts: int, reserve: int, concurrency: int
) -> None:
    limits = fd_limits.connection_limits(nofile, hosts)
    assert (limits.reserve, limits.concurrency) == (reserve, concurrency)
    assert limits.guard == nofile - reserve
    assert 1 <= limits.concurrency < limits.guard < nofile


def raise_in_a_child(soft: int, hard: int, maximum: int = fd_limits.MAX_NOFILE) -> str:
    """What :func:`fd_limits.raise_nofile` does in a process started with these limits:
    its result, the soft limit after and its log."""
    code = (
        "import logging, resource, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')\n"
        "from xce_resize_plugin.controllers.live.fd_limits import raise_nofile\n"
        f"got = raise_nofile({maximum})\n"
        "print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], file=sys.stderr)\n"
    )

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limits,
        check=True,
    )
    return out.stderr


def test_the_soft_descriptor_limit_is_raised_never_lowered() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 512:
        pytest.skip(f"the hard descriptor limit ({hard}) is too low to try")
    assert raise_in_a_child(256, 512) == (
        "INFO raised the soft limit of open files from 256 to 512 (hard limit 512)\n512 512\n"
    )
    # Capped at the maximum; above it, left alone but counted as the maximum (a
    # container's soft limit of a million is no licence for a million connections); at
    # the hard limit, nothing to say.
    assert raise_in_a_child(256, 512, maximum=300).endswith("to 300 (hard limit 512)\n300 300\n")
    assert raise_in_a_child(400, 512, maximum=300) == "300 400\n"
    assert raise_in_a_child(256, 256) == "256 256\n"


def test_refusals_are_said_once_in_a_while() -> None:
    now = [1000.0]
    refusals = fd_limits.Refusals(clock=lambda: now[0])

    def record() -> logging.LogRecord:
        return logging.LogRecord(
            "uvicorn.error", logging.WARNING, "", 0, fd_limits.UVICORN_REFUSAL, None, None
        )

    first = record()
    assert refusals.filter(first) and first.getMessage() == (
        "out of connections: a request was answered 503"
    )
    assert not any(refusals.filter(record()) for _ in range(5))
    now[0] += fd_limits.REFUSALS_LOGGED_EVERY
    later = record()
    assert refusals.filter(later) and later.getMessage().endswith("(5 more since the last line)")
    other = logging.LogRecord("uvicorn.error", logging.WARNING, "", 0, "other", None, None)
    assert refusals.filter(other)


# -- finished_job_keep ------------------------------------------------------------


def test_finished_jobs_are_kept_an_hour_by_default_as_lsf_clean_period() -> None:
    assert parse().finished_job_keep == 3600.0 == settings.DEFAULT_FINISHED_JOB_KEEP


@pytest.mark.parametrize(
    ("value", "seconds"), [(0, 0.0), (0.5, 0.5), (300, 300.0), (365 * 86400, 365 * 86400.0)]
)
def test_a_finished_job_keep_is_taken_in_seconds(value: Any, seconds: float) -> None:
    keep = parse(finished_job_keep=value).finished_job_keep
    assert keep == seconds and isinstance(keep, float)


@pytest.mark.parametrize(
    "value", [-1, -0.5, math.nan, math.inf, 365 * 86400 + 1, 1e12, "3600", True, [60], None]
)
def test_a_bad_finished_job_keep_is_named_in_one_line(value: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(finished_job_keep=value)
    assert str(refused.value) == (
        "Configuration error: /site/controller.toml: controller.finished_job_keep: must be "
        f"a number of seconds from 0 to 31536000, got {value!r}"
    )


# -- finished_job_max -------------------------------------------------------------


def test_a_user_keeps_a_thousand_finished_jobs_by_default() -> None:
    assert parse().finished_job_max == 1000 == settings.DEFAULT_FINISHED_JOB_MAX


@pytest.mark.parametrize("value", [0, 1, 50_000, 10_000_000])
def test_a_finished_job_max_is_taken_as_a_count(value: int) -> None:
    assert parse(finished_job_max=value).finished_job_max == value


@pytest.mark.parametrize("value", [-1, 10_000_001, 2.0, math.nan, "100", True, None])
def test_a_bad_finished_job_max_is_named_in_one_line(value: Any) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(finished_job_max=value)
    assert str(refused.value) == (
        "Configuration error: /site/controller.toml: controller.finished_job_max: must be "
        f"an integer from 0 to 10000000, got {value!r}"
    )
