"""The declared public API (``xce_resize_plugin.__all__``) and the pytest plugin's entry point."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest

import xce_resize_plugin
from xce_resize_plugin import testing

ROOT = Path(__file__).resolve().parents[2]
#: What ``import xce_resize_plugin`` must not load: ``bresize`` imports the package and
#: starts in a few milliseconds only while these stay out.
HEAVY = ("pluggy", "attrs", "cattrs", "lmdb", "orjson")


def test_importing_the_package_loads_no_dependency() -> None:
    code = (
        "import json, sys, xce_resize_plugin\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize("name", xce_resize_plugin.__all__)
def test_every_public_name_resolves(name: str) -> None:
    value = getattr(xce_resize_plugin, name)
    assert value is not None
    # The same object as where it is defined (a lazy name is not a copy).
    assert getattr(xce_resize_plugin, name) is value


def test_public_names_are_listed_once_and_unknown_names_fail() -> None:
    assert len(set(xce_resize_plugin.__all__)) == len(xce_resize_plugin.__all__)
    assert set(xce_resize_plugin.__all__) <= set(dir(xce_resize_plugin))
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = xce_resize_plugin.no_such_name  # type: ignore[attr-defined]


def test_the_testing_plugin_is_declared_and_loaded(pytestconfig: pytest.Config) -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = cfg["options.entry_points"]["pytest11"].split("=")
    assert [part.strip() for part in declared] == ["xce_resize", "xce_resize_plugin.testing"]
    # Loaded by pytest through the entry point (reinstall the package if this fails).
    assert pytestconfig.pluginmanager.get_plugin("xce_resize") is testing


def test_loading_the_testing_plugin_imports_no_controller() -> None:
    code = (
        "import json, sys, xce_resize_plugin.testing\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('xce_resize_plugin.')]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == ["xce_resize_plugin.testing"]
