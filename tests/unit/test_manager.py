"""get_plugin_manager: specs, defaults, policy files and their errors, the trace switch."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from xce_resize_plugin import default_policies, errors, plugin
from xce_resize_plugin.core.models import JobInfo, JobState, Task
from xce_resize_plugin.host import Principal
from xce_resize_plugin.manager import get_plugin_manager

JOB = JobInfo("9", "bob", JobState.RUN, 1, 4, (Task(0, "h"),), resizable=True)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_fresh_manager_each_call_with_plugin_and_defaults() -> None:
    a = get_plugin_manager(entry_points=False)
    b = get_plugin_manager(entry_points=False)
    assert a is not b
    assert a.is_registered(plugin) and a.is_registered(default_policies)


def test_entry_point_registers_the_plugin_once() -> None:
    pm = get_plugin_manager()
    assert pm.get_plugin("resize") is plugin
    assert len([p for p in pm.get_plugins() if p is plugin]) == 1


def test_site_policy_runs_before_defaults(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "deny.py",
        "from xce_resize_plugin import hookimpl\n"
        "@hookimpl\n"
        "def xce_resize_authorize(principal, job, action):\n"
        "    return False if action == 'grow' else None\n",
    )
    pm = get_plugin_manager({"policy_files": [f.name]}, base_dir=tmp_path, entry_points=False)
    owner = Principal("bob")
    assert pm.hook.xce_resize_authorize(principal=owner, job=JOB, action="grow") is False
    assert pm.hook.xce_resize_authorize(principal=owner, job=JOB, action="release") is True


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("def f(:\n", r"line 1: "),
        ("x = 1\nraise RuntimeError('boom')\n", r"line 2: RuntimeError: boom"),
        ("import no_such_module_xyz\n", r"line 1: ModuleNotFoundError"),
        ("import sys\nsys.exit(3)\n", r"line 2: SystemExit: 3"),
        (
            "from xce_resize_plugin import hookimpl\n"
            "@hookimpl\ndef xce_resize_autorize(principal, job, action):\n    return True\n",
            r"unknown hook 'xce_resize_autorize'|xce_resize_autorize",
        ),
        (
            "from xce_resize_plugin import hookimpl\n"
            "@hookimpl\ndef xce_resize_authorize(principal, job, action, extra):\n    return 1\n",
            r"extra",
        ),
    ],
)
def test_broken_policy_file_is_a_startup_error_naming_it(
    tmp_path: Path, text: str, expect: str
) -> None:
    f = write(tmp_path, "site_policy.py", text)
    with pytest.raises(errors.ConfigError, match=expect) as exc:
        get_plugin_manager({"policy_files": [str(f)]}, entry_points=False)
    assert str(f) in str(exc.value)


def test_missing_policy_file_and_bad_list(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="no such file"):
        get_plugin_manager({"policy_files": [str(tmp_path / "nope.py")]}, entry_points=False)
    with pytest.raises(errors.ConfigError, match="must be a list"):
        get_plugin_manager({"policy_files": "hooks/x.py"}, entry_points=False)


def test_trace_logs_every_hook_call(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XCE_RESIZE_TRACE", "1")
    pm = get_plugin_manager(entry_points=False)
    with caplog.at_level(logging.INFO, logger="xce_resize_plugin.trace"):
        pm.hook.xce_resize_authorize(principal=Principal("bob"), job=JOB, action="view")
    text = caplog.text
    assert "call xce_resize_authorize" in text and "-> True" in text


def test_no_trace_without_the_switch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("XCE_RESIZE_TRACE", raising=False)
    pm = get_plugin_manager(entry_points=False)
    with caplog.at_level(logging.INFO, logger="xce_resize_plugin.trace"):
        pm.hook.xce_resize_authorize(principal=Principal("bob"), job=JOB, action="view")
    assert "xce_resize_authorize" not in caplog.text


def test_a_policy_file_listed_twice_is_a_configuration_error(tmp_path: Path) -> None:
    f = write(tmp_path, "site.py", "X = 1\n")
    twice = {"policy_files": [str(f), str(tmp_path / "." / "site.py")]}
    with pytest.raises(errors.ConfigError, match=r"site\.py is listed twice \(also as "):
        get_plugin_manager(twice, entry_points=False)
    (tmp_path / "d").mkdir()
    with pytest.raises(errors.ConfigError, match=r"policy file .*d: a directory, not a file"):
        get_plugin_manager({"policy_files": [str(tmp_path / "d")]}, entry_points=False)


def test_a_policy_file_may_define_dataclasses(tmp_path: Path) -> None:
    """With postponed annotations a @dataclass looks its module up in sys.modules: the
    module was not there while it ran (AttributeError on 'NoneType')."""
    text = (
        "from __future__ import annotations\nfrom dataclasses import dataclass\n"
        "@dataclass\nclass Rack:\n    name: str\nRACK = Rack('r1')\n"
    )
    pm = get_plugin_manager(
        {"policy_files": [str(write(tmp_path, "dc.py", text))]}, entry_points=False
    )
    (module,) = [p for name, p in pm.list_name_plugin() if name.startswith("policy:")]
    assert module.RACK.name == "r1"


@pytest.mark.parametrize(
    ("mode", "owner", "says"),
    [
        (0o666, 0, "writable by others (mode 0666)"),
        (0o644, 12345, "owned by uid 12345, not root"),
    ],
)
def test_as_root_a_policy_file_others_can_change_is_refused(
    tmp_path: Path, mode: int, owner: int, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded by a root controller it runs as root: any user who can write it would."""
    from xce_resize_plugin import manager

    f = write(tmp_path, "site.py", "X = 1\n")
    f.chmod(mode)
    real_stat = Path.stat

    def stat(self: Path, **kw: object) -> object:
        # As root would see them, whoever runs the test: the file's owner as given,
        # its directory root's.
        st = real_stat(self, **kw)  # type: ignore[arg-type]
        if self in (f, f.parent):
            return os.stat_result((st.st_mode, *st[1:4], owner if self == f else 0, *st[5:]))
        return st

    monkeypatch.setattr(Path, "stat", stat)
    monkeypatch.setattr(manager.os, "geteuid", lambda: 0)
    with pytest.raises(errors.ConfigError, match=f"its file {f} is {re.escape(says)}"):
        get_plugin_manager({"policy_files": [str(f)]}, entry_points=False)
    # Not root: the file runs as its user only; not checked.
    monkeypatch.setattr(manager.os, "geteuid", lambda: 1000)
    get_plugin_manager({"policy_files": [str(f)]}, entry_points=False)


def test_a_policy_file_runs_from_its_source_never_from_pycache(tmp_path: Path) -> None:
    """A .pyc planted in __pycache__ beside a checked policy file (its directory may be
    one others write, a sticky one) ran instead of the file: code as root."""
    import importlib.util
    import py_compile

    f = write(tmp_path, "site.py", "X = 1\n")
    other = write(tmp_path, "other.py", "X = 2\n")
    py_compile.compile(
        str(other),
        cfile=importlib.util.cache_from_source(str(f)),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    pm = get_plugin_manager({"policy_files": [str(f)]}, entry_points=False)
    (module,) = [p for name, p in pm.list_name_plugin() if name.startswith("policy:")]
    assert module.X == 1
