"""The package keeps the shape docs/architecture.md describes.

The layering itself is checked by import-linter (`tox -e lint`); these tests check
what it does not: no import cycle between modules (type-only imports included), no
function longer than 80 lines, comments that cite only documents in the repository, and
a license file that matches the declared license.
"""

from __future__ import annotations

import ast
import configparser
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "xce_resize_plugin"
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported_modules(path: Path, known: set[str]) -> Iterator[str]:
    """Every package module ``path`` imports, wherever the import statement stands."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known_prefix(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield from _known_prefix(full if full in known else base, known)


def _known_prefix(name: str, known: set[str]) -> Iterator[str]:
    while name and name not in known:
        name = name.rpartition(".")[0]
    if name:
        yield name


def import_graph() -> dict[str, set[str]]:
    files = package_files()
    known = {module_name(f) for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        this = module_name(f)
        # A package's __init__ importing its own submodules is how it re-exports them.
        graph[this] = {
            m for m in imported_modules(f, known) if m != this and not m.startswith(this + ".")
        }
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def long_functions(path: Path, root: Path = ROOT) -> Iterator[tuple[str, int]]:
    """``(where, length)`` of each function in ``path`` longer than the limit."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield f"{path.relative_to(root)}:{node.lineno} {node.name}", length


def test_long_functions_are_found(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    sample = tmp_path / "sample.py"
    sample.write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    found = [(name.rsplit(" ", 1)[1], n) for name, n in long_functions(sample, tmp_path)]
    assert found == [("long", MAX_FUNCTION_LINES + 1)]


def test_no_function_longer_than_the_limit() -> None:
    found = [f"{name} ({n} lines)" for f in package_files() for name, n in long_functions(f)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(found)


CITATION = re.compile(r"DESIGN\s*§|\.\./shared/(?!traces)|reference/lsf-resizable")


def test_comments_and_docs_cite_only_documents_in_the_repository() -> None:
    places = [*package_files(), *sorted((ROOT / "hooks").glob("*.py"))]
    places += [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    bad = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in places
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if CITATION.search(line)
    ]
    assert not bad, "cites a document outside the repository: " + ", ".join(bad)


def test_license_file_matches_the_declared_license() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["metadata"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


HOOK_CALL = re.compile(r"\.hook\.xce_\w+\s*\(")
TYPED_WRAPPERS = {PACKAGE / "host.py", PACKAGE / "policy.py"}


def test_hooks_are_called_only_through_the_typed_wrappers() -> None:
    """``host.HostHooks`` and ``policy.HookPolicy`` are the only callers of ``pm.hook``,
    so mypy checks every call site's arguments and result."""
    bad = [
        f"{f.relative_to(ROOT)}:{i}"
        for f in package_files()
        if f not in TYPED_WRAPPERS
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if HOOK_CALL.search(line) or "getattr(self._pm.hook" in line
    ]
    assert not bad, "hook called by name outside the typed wrappers: " + ", ".join(bad)
    assert HOOK_CALL.search("pm.hook.xce_sched_cycle(controller=c)")
