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
import importlib
import pkgutil
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


def _error_classes() -> list[type[errors.ResizeError]]:
    """Every error class of the package that sets its own code (wherever it is defined:
    the live controller has its own), found by importing every module."""
    package = Path(errors.__file__).parent
    for info in pkgutil.walk_packages([str(package)], "xce_resize_plugin."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: list[type[errors.ResizeError]] = []
    todo = [errors.ResizeError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "code" in vars(cls) and cls is not errors.ResizeError:
            found.append(cls)
    return sorted(found, key=lambda c: c.code)


@pytest.mark.parametrize("error", _error_classes(), ids=lambda e: e.code)
def test_every_error_code_is_in_the_user_guides_table(error: type[errors.ResizeError]) -> None:
    """Section 6 of the user guide lists every code a user can meet, with its message."""
    text = (DOCS / "user-guide.md").read_text()
    table = text[text.index("## 6. Error codes and messages") :]
    table = table[: table.index("\n## ", 1)]
    row = next(
        (line for line in table.splitlines() if line.startswith(f"| `{error.code}` |")), None
    )
    assert row is not None, f"{error.code} ({error.__module__}) has no row in the table"
    assert f"| {error.message} |" in row


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """CI calls the command the README gives for the tests, so that what a newcomer
    types is what CI proves works on a clean clone."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run the tests", 1)[1]
    command = re.findall(r"```sh\n(.*?)\n```", section, re.S)[0]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command


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


def test_the_sweep_example_in_the_docs_is_the_shipped_file() -> None:
    """docs/simulation.md shows docs/examples/sweep.toml from ``[sweep]`` on."""
    doc = (DOCS / "simulation.md").read_text()
    block = doc.split("# docs/examples/sweep.toml", 1)[1].split("```", 1)[0]
    shown = block[block.index("[sweep]") :]
    shipped = (DOCS / "examples" / "sweep.toml").read_text()
    assert shipped[shipped.index("[sweep]") :] == shown
