"""``get_plugin_manager()``: a fresh manager with the specs, entry points, site policy
files and the built-in defaults (pluggy's eggsample layout; no module-level manager).

A policy file that cannot be imported, or that implements a hook that does not exist,
is a :class:`~xce_resize_plugin.errors.ConfigError` naming the file (and the line, where
Python reports one): the controller refuses to start rather than run with half a policy.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from xce_resize_plugin import default_policies, hookspecs
from xce_resize_plugin.errors import ConfigError

PROJECT = "xce"
TRACE_ENV = "XCE_RESIZE_TRACE"
log = logging.getLogger("xce_resize_plugin.trace")


def get_plugin_manager(
    config: Mapping[str, Any] | None = None,
    *,
    base_dir: Path | None = None,
    entry_points: bool = True,
    register_plugin: bool = True,
) -> pluggy.PluginManager:
    """Build the manager a host (or the embedded controller) calls the hooks through.

    :param config: the ``[resize]`` section; ``policy_files`` lists site policy files
        (relative paths are taken from ``base_dir``).
    :param entry_points: load ``xce.plugins`` and ``xce_resize.policies`` entry points.
    :param register_plugin: register this package's plugin directly when entry points
        are off or it is not installed as a distribution (tests, the embedded host).
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    if entry_points:
        pm.load_setuptools_entrypoints("xce.plugins")
        pm.load_setuptools_entrypoints("xce_resize.policies")
    if register_plugin and not pm.has_plugin("resize"):
        from xce_resize_plugin import plugin

        if not pm.is_registered(plugin):
            pm.register(plugin, name="resize")
    pm.register(default_policies, name="resize-defaults")
    _check_pending(pm, "plugins from entry points")
    seen: dict[Path, Path] = {}
    for path in _policy_paths(config or {}, base_dir):
        first = seen.setdefault(path.resolve(), path)
        if first is not path:
            # Registered twice, every hook of it would answer twice (pluggy refused the
            # second name with a traceback).
            raise ConfigError(f"policy file {path} is listed twice (also as {first})")
        module = load_policy_file(path)
        try:
            pm.register(module, name=f"policy:{path}")
        except pluggy.PluginValidationError as exc:
            raise ConfigError(f"policy file {path}: {exc}") from exc
        _check_pending(pm, f"policy file {path}")
    if os.environ.get(TRACE_ENV, "") not in ("", "0"):
        enable_trace(pm)
    return pm


def _policy_paths(config: Mapping[str, Any], base_dir: Path | None) -> list[Path]:
    files = config.get("policy_files", [])
    if isinstance(files, str) or not isinstance(files, Iterable):
        raise ConfigError(f"[resize] policy_files must be a list of paths, got {files!r}")
    out = []
    for item in files:
        if not isinstance(item, str):
            raise ConfigError(f"[resize] policy_files entries must be paths, got {item!r}")
        path = Path(item)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        out.append(path)
    return out


def load_policy_file(path: Path) -> ModuleType:
    """Import one site policy file as a module, or raise ConfigError naming it."""
    if path.is_dir():
        raise ConfigError(f"policy file {path}: a directory, not a file")
    if not path.is_file():
        raise ConfigError(f"policy file {path}: no such file")
    _check_owner(path)
    name = f"xce_resize_policy_{abs(hash(str(path.resolve())))}"
    module = ModuleType(name)
    module.__file__ = str(path)
    # Importable while it runs, as any module is: a @dataclass looks its module up.
    sys.modules[name] = module
    try:
        # Compiled from the file checked above, never from __pycache__: a .pyc beside
        # it (planted in a directory others may write, a sticky one too) would run
        # instead of the source, and nothing is written there either.
        code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SyntaxError as exc:
        raise ConfigError(f"policy file {path}, line {exc.lineno}: {exc.msg}") from exc
    except (Exception, SystemExit) as exc:  # sys.exit() at import is a failure too
        line = _line_in(path, exc)
        where = f", line {line}" if line else ""
        raise ConfigError(f"policy file {path}{where}: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules.pop(name, None)
    return module


def _check_owner(path: Path, euid: int | None = None) -> None:
    """As root, a policy file runs as root: it must be root's, and no one else may
    write it or replace it (its directory), as sudo and sshd ask of their files. Any
    local user could otherwise run code as root by editing it."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return
    for item, what in ((path, "file"), (path.parent, "directory")):
        st = item.stat()
        sticky = what == "directory" and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0:
            why = f"owned by uid {st.st_uid}, not root"
        elif st.st_mode & 0o022 and not sticky:
            why = f"writable by others (mode {st.st_mode & 0o7777:04o})"
        else:
            continue
        raise ConfigError(
            f"policy file {path}: its {what} {item} is {why}: whoever can change it would "
            "run code as root (chown root, chmod go-w)"
        )


def _line_in(path: Path, exc: BaseException) -> int | None:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == str(path):
            return frame.lineno
    return None


def _check_pending(pm: pluggy.PluginManager, what: str) -> None:
    """Refuse hook implementations that match no spec (a typo would silently do nothing)."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"{what}: {exc}") from exc


def enable_trace(pm: pluggy.PluginManager) -> None:
    """Log every hook call with its arguments and result (``XCE_RESIZE_TRACE=1``)."""

    def before(hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
        args = {k: v for k, v in kwargs.items() if k != "controller"}
        log.info("call %s(%s)", hook_name, args)

    def after(outcome: Any, hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
        try:
            log.info("  %s -> %r", hook_name, outcome.get_result())
        except BaseException as exc:  # the hook raised: show it, pluggy re-raises
            log.info("  %s raised %s: %s", hook_name, type(exc).__name__, exc)

    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("xce-resize trace: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    pm.add_hookcall_monitoring(before, after)
