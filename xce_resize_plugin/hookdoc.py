"""Render the hook reference (docs/hooks.md) from :mod:`xce_resize_plugin.hookspecs`.

The spec module is the single source: ``python -m xce_resize_plugin.hookdoc >
docs/hooks.md`` rewrites the page, and a test fails when the page differs, so a hook
can be neither undocumented nor documented with a stale signature.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator

from xce_resize_plugin import hookspecs

INTRO = """\
# Hook reference

Generated from `xce_resize_plugin/hookspecs.py` by `python -m xce_resize_plugin.hookdoc`;
do not edit by hand. Host hooks are called by the controller (XCE or the embedded one)
with a `controller` satisfying `xce_resize_plugin.host.Controller`; policy hooks are
called by the plugin and implemented by sites in policy files (see admin-guide.md), with
built-in defaults registered `trylast`.
"""


def _phases() -> Iterator[tuple[str, list[str]]]:
    """Phase banners and the hooks under each, in source order."""
    source = inspect.getsource(hookspecs)
    phase = ""
    names: list[str] = []
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# ----") and i + 1 < len(lines) and lines[i + 1].startswith("# "):
            title = lines[i + 1][2:].strip()
            if not title.startswith("----"):
                if names:
                    yield phase, names
                phase, names = title, []
        match = re.match(r"def (xce_\w+)\(", line)
        if match:
            names.append(match.group(1))
    if names:
        yield phase, names


def signature(name: str) -> str:
    """``name(arg: Type, ...) -> Result`` as written in the spec."""
    func = getattr(hookspecs, name)
    sig = inspect.signature(func)
    # Annotations are strings (postponed evaluation): print them as written.
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    ret = sig.return_annotation
    result = ret if isinstance(ret, str) else inspect.formatannotation(ret)
    return f"{name}({params}) -> {result}"


def hook_names() -> list[str]:
    return [n for _, names in _phases() for n in names]


def render() -> str:
    out = [INTRO]
    for phase, names in _phases():
        out.append(f"\n## {phase[0].upper()}{phase[1:]}\n")
        for name in names:
            func = getattr(hookspecs, name)
            opts = getattr(func, "xce_spec", {}) or {}
            flags = " (firstresult)" if opts.get("firstresult") else ""
            out.append(f"\n### `{name}`{flags}\n\n```python\n{signature(name)}\n```\n")
            doc = inspect.cleandoc(func.__doc__ or "")
            out.append(f"\n{doc}\n")
    return "".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
