"""The docs say what the code does (as datasette checks its plugin hooks).

- docs/hooks.md is exactly what hookspecs.py renders to, so no hook is undocumented
  and no signature is stale;
- every hook has a test named ``test_hook_<name>`` somewhere under tests/;
- every [resize] configuration key is in the admin guide, every error code in the
  user guide, and every guide the README links to exists;
- the example of "Testing your policy" in docs/hooks.md runs as a site would run it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from xce_resize_plugin import errors, hookdoc
from xce_resize_plugin.core import config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_hook_reference_is_generated_from_the_specs() -> None:
    rendered = hookdoc.render()
    on_disk = (DOCS / "hooks.md").read_text()
    assert on_disk == rendered, "run: python -m xce_resize_plugin.hookdoc > docs/hooks.md"


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return names


@pytest.mark.parametrize("hook", hookdoc.hook_names())
def test_every_hook_has_a_test(hook: str) -> None:
    assert any(
        n == f"test_hook_{hook}" or n.startswith(f"test_hook_{hook}_") for n in _test_names()
    ), f"no test_hook_{hook} under tests/"


@pytest.mark.parametrize("key", [k.name for k in config.KEYS])
def test_every_config_key_is_in_the_admin_guide(key: str) -> None:
    assert f"`{key}`" in (DOCS / "admin-guide.md").read_text()


@pytest.mark.parametrize("error", [e for e in errors.ERRORS if e.code.startswith("LSBE_")])
def test_every_lsf_error_is_in_the_user_guide(error: type[errors.ResizeError]) -> None:
    text = (DOCS / "user-guide.md").read_text()
    assert error.code in text and error.message in text


def test_readme_links_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    for link in re.findall(r"\]\((docs/[^)#]+)\)", readme):
        assert (ROOT / link).is_file(), link


def _files_in(section: str) -> dict[str, str]:
    """The ``python`` code blocks of a section, by the file name on their first line."""
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return {block.split(":", 1)[0].removeprefix("# "): block for block in blocks}


def test_the_testing_example_runs_as_a_site_would(pytester: pytest.Pytester) -> None:
    """The example of "Testing your policy" (docs/hooks.md), copied into an empty
    directory and run by pytest in its own process: the fixtures come from the
    installed plugin alone."""
    page = (DOCS / "hooks.md").read_text()
    section = page[page.index("\n## Testing your policy\n") :]
    files = _files_in(section)
    assert sorted(files) == ["max_grow.py", "test_max_grow.py"]
    for name, text in files.items():
        (pytester.path / name).write_text(text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=3)
