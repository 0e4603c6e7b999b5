"""Reading the TOML files that describe a cluster: scenario files and the live configuration.

Both refuse what they do not know with a :class:`~xce_resize_plugin.errors.ConfigError`
that names the file and the key path (``jobs[2].tasks``), so a typo never silently falls
back to a default.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

from xce_resize_plugin.controllers.input_files import read_capped
from xce_resize_plugin.errors import ConfigError

#: The most slots a host of a cluster file may have (2**20): more is no machine's node,
#: and a job of that many tasks would take the memory before it starts.
MAX_HOST_SLOTS = 1 << 20

#: Checks one integer at a key path (``cluster.hosts.a``): returns it, or the error.
#: Each kind of file words its own messages, so the check is the caller's.
IntCheck: TypeAlias = Callable[[str, Any], int]

#: The largest TOML file read (16 MiB): a scenario of 100,000 jobs is about 10 MiB, and
#: a larger name (``/dev/zero`` behind a ``.toml`` link, a runaway generated file)
#: would take the memory before the parser says anything (docs/simulation.md).
MAX_TOML_BYTES = 16 << 20


class Where:
    """Builds error messages that name the file and the key path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    def table(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        """``data[key]`` (default empty), which must be a TOML table."""
        value = data.get(key, {})
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a table")
        return value

    def only(self, name: str, table: Mapping[str, Any], keys: set[str]) -> None:
        """Refuse keys of ``table`` other than ``keys``, naming the first unknown one."""
        unknown = sorted(set(table) - keys)
        if unknown:
            known = ", ".join(sorted(keys))
            raise self.error(f"{name}.{unknown[0]}", f"unknown key (known: {known})")

    def section(self, data: Mapping[str, Any], name: str, keys: set[str]) -> Mapping[str, Any]:
        """The table ``[name]`` (default empty), holding none but ``keys``."""
        table = self.table(data, name)
        self.only(name, table, keys)
        return table

    def int_map(self, key: str, value: Any, check: IntCheck) -> dict[str, int]:
        """``value``, a table of ``name = integer`` at ``key``, each value ``check``-ed."""
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a table of name = number")
        return {str(name): check(f"{key}.{name}", n) for name, n in value.items()}

    def hosts(self, value: Any, check: IntCheck) -> dict[str, int]:
        """``[cluster] hosts``: at least one ``host = slots``, in the file's order."""
        if value is None:
            raise self.error("cluster.hosts", "missing (e.g. hosts = { hostA = 4, hostB = 4 })")
        hosts = self.int_map("cluster.hosts", value, check)
        if not hosts:
            raise self.error("cluster.hosts", "needs at least one host")
        for name, slots in hosts.items():
            if slots > MAX_HOST_SLOTS:
                raise self.error(f"cluster.hosts.{name}", f"at most {MAX_HOST_SLOTS:,} slots")
        return hosts


def read_toml(path: Path, limit: int | None = None) -> dict[str, Any]:
    """A TOML file's contents, or ConfigError naming the file (scenarios, the live
    configuration, ``simulate --config``, sweep files): a regular file of at most
    ``limit`` bytes (default :data:`MAX_TOML_BYTES`), UTF-8, valid TOML, nested no
    deeper than the parser's recursion takes."""
    try:
        data = read_capped(path, MAX_TOML_BYTES if limit is None else limit)
        return tomllib.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
