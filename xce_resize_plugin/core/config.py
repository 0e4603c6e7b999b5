"""The ``[resize]`` configuration section: its keys, defaults and checks.

Every key is documented in docs/admin-guide.md (a test compares the two). An unknown
key or a value of the wrong type is a :class:`~xce_resize_plugin.errors.ConfigError`
naming the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from xce_resize_plugin.core import reclaim
from xce_resize_plugin.errors import ConfigError

#: The largest ``journal_map_size``: the map the journal grows to at most
#: (``journal.lmdb_env.MAX_MAP_SIZE``, 1 TiB; docs/journal-format.md). Not imported:
#: this module does not load LMDB; a unit test keeps the two equal. A larger start
#: could never be grown into, and LMDB cannot map one that exceeds the address space.
MAX_JOURNAL_MAP_SIZE = 1 << 40
#: The most failed attempts in a row a grow may be given (docs/admin-guide.md).
MAX_NOTIFY_FAILURES = 100


@frozen
class Settings:
    """The engine's share of the ``[resize]`` configuration (docs/admin-guide.md)."""

    notify_timeout: float = 60.0
    notify_max_failures: int = 3
    stop_grace: float = 10.0
    allow_grow: bool = True
    #: The longest a grow may wait for its tasks to be ready (``wait_ready``).
    max_ready_timeout: float = 600.0
    #: The longest drain time a release (or a job's default) may ask for, in seconds.
    max_stop_grace: float = 300.0


@frozen
class Key:
    name: str
    kind: type | tuple[type, ...]
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None


KEYS: tuple[Key, ...] = (
    Key(
        "notify_timeout",
        (int, float),
        60.0,
        "seconds a notification command may run before it counts as failed",
        0.001,
    ),
    Key(
        "notify_max_failures",
        int,
        3,
        "consecutive failed attempts after which a pending grow is cancelled",
        1,
        # A simulated controller retries a failing notification at the same instant:
        # thousands of attempts there looked like a plugin that never settles.
        MAX_NOTIFY_FAILURES,
    ),
    Key(
        "stop_grace",
        (int, float),
        10.0,
        "seconds between SIGTERM and SIGKILL when a shrink stops tasks",
        0,
    ),
    Key(
        "max_stop_grace",
        (int, float),
        300.0,
        "longest drain time (seconds) a release or a job's default may ask for "
        "before its tasks are stopped (--grace)",
        0,
    ),
    Key("allow_grow", bool, True, "false refuses every grow (LSF code 754)"),
    Key(
        "max_ready_timeout",
        (int, float),
        600.0,
        "the longest a grow with wait_ready may wait for its new tasks to be ready "
        "(seconds); also the wait of one that names none",
        0.001,
    ),
    Key("policy_files", list, [], "site policy files (Python, pluggy hooks) to load"),
    Key(
        "journal_sync",
        bool,
        True,
        "fsync every journal commit; turn off only for throw-away simulations",
    ),
    Key(
        "journal_defer",
        bool,
        False,
        "write transitions without effects on the host with the next one that has "
        "some (needs journal_sync off; for simulations)",
    ),
    Key(
        "journal_batch",
        int,
        0,
        "with journal_defer, let every transition wait, effects included, and write "
        "them this many entries at a time (0: off); a crash loses what the host did "
        "since, so only for simulations that are never resumed",
        0,
    ),
    Key(
        "journal_map_size",
        int,
        64 << 20,
        "initial LMDB map size in bytes (it grows on demand)",
        1 << 20,
        MAX_JOURNAL_MAP_SIZE,
    ),
    Key(
        "max_requeue",
        int,
        3,
        "times a job that a host failure ends may be requeued (when the site's "
        "xce_resize_host_lost says so) before it ends EXIT instead; 0: never",
        0,
    ),
    # -- reclaim (shrinking running jobs for the blocked queue head) -------------------
    Key(
        "reclaim",
        str,
        "off",
        '"shrink" asks resizable jobs to release tasks when that starts the blocked '
        'queue head now; "off" never does',
    ),
    Key(
        "reclaim_min_delay",
        (int, float),
        0.0,
        "reclaim only for a head expected to start at least this many seconds later",
        0,
    ),
)
BY_NAME = {k.name: k for k in KEYS}


def check(section: Mapping[str, Any], where: str = "[resize]") -> dict[str, Any]:
    """Validated values of the section with defaults filled in, or ConfigError."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(section).__name__}")
    unknown = sorted(set(section) - set(BY_NAME))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(BY_NAME))})"
        )
    out: dict[str, Any] = {}
    for key in KEYS:
        value = section.get(key.name, key.default)
        kinds = key.kind if isinstance(key.kind, tuple) else (key.kind,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{where} {key.name} must be {names}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where} {key.name} must be a finite number, got {value!r}")
        _check_range(key, value, where)
        out[key.name] = value
    for item in out["policy_files"]:
        if not isinstance(item, str):
            raise ConfigError(f"{where} policy_files entries must be paths, got {item!r}")
    if out["reclaim"] not in reclaim.MODES:
        raise ConfigError(
            f"{where} reclaim must be one of {', '.join(map(repr, reclaim.MODES))}, "
            f"got {out['reclaim']!r}"
        )
    if out["journal_defer"] and out["journal_sync"]:
        raise ConfigError(
            f"{where} journal_defer needs journal_sync = false: deferred writes cannot "
            "be durable before a request is answered"
        )
    if out["journal_batch"] and not out["journal_defer"]:
        raise ConfigError(
            f"{where} journal_batch needs journal_defer = true: it batches deferred writes"
        )
    return out


def _check_range(key: Key, value: Any, where: str) -> None:
    """ConfigError if a number is outside its key's bounds."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    low = -math.inf if key.minimum is None else key.minimum
    if key.maximum is not None and not low <= value <= key.maximum:
        raise ConfigError(
            f"{where} {key.name} must be between {key.minimum} and {key.maximum}, got {value!r}"
        )
    if value < low:
        raise ConfigError(f"{where} {key.name} must be at least {key.minimum}, got {value!r}")


def settings(section: Mapping[str, Any]) -> Settings:
    values = check(section)
    return Settings(
        notify_timeout=float(values["notify_timeout"]),
        notify_max_failures=values["notify_max_failures"],
        stop_grace=float(values["stop_grace"]),
        allow_grow=values["allow_grow"],
        max_ready_timeout=float(values["max_ready_timeout"]),
        max_stop_grace=float(values["max_stop_grace"]),
    )
