"""Render the hook reference (docs/hooks.md) from :mod:`xce_resize_plugin.hookspecs`.

The spec module is the single source: ``python -m xce_resize_plugin.hookdoc >
docs/hooks.md`` rewrites the page, and a test fails when the page differs, so a hook
can be neither undocumented nor documented with a stale signature. The page ends with
:data:`TESTING`, how a site tests its policy with :mod:`xce_resize_plugin.testing`; a
test runs its example files as a site would.
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
with a `controller` satisfying `xce_resize_plugin.Controller`; policy hooks are
called by the plugin and implemented by sites in policy files (see admin-guide.md), with
built-in defaults registered `trylast`.
"""

TESTING = """
## Testing your policy

Installing `xce_resize_plugin` adds a pytest plugin, `xce_resize`
(`xce_resize_plugin.testing`), so a site's own tests get these fixtures without any
import or `conftest.py`:

- `resize_config`: the `[resize]` section the other fixtures use. It is `{}` until a
  test module or a `conftest.py` overrides it, e.g. with the policy files under test
  (relative paths are taken from pytest's rootdir).
- `resize_plugin_manager`: `get_plugin_manager(resize_config)` without entry points:
  the plugin, the built-in policies and the configured policy files.
- `resize_sim`: the embedded controller in simulated time with that manager, on hosts
  `hA`..`hD` with 4 slots each, closed after the test. `submit`, `request_resize`,
  `settle`, `run`, `job` and `check_invariants` drive and inspect it.
- `resize_sim_factory`: makes more such controllers (other hosts, limits, a restart
  on the same state), all closed after the test.
- `resize_scenario`: runs a scenario file, or the same as a table (scenarios.md), and
  returns its result: each command's exit, code and message, each job's end state.
- `resize_live_factory`: makes a live cluster in `tmp_path`, a real controller and its
  agents (call `start()`, then use its REST helpers). It is a personal controller
  (`single_user = true`): the jobs of its users `alice`, `bob` and `root` all run as
  the user who runs the tests. Every process it caused is killed by pid after the
  test. Needs Linux and the `live` extra.

To call a policy's functions directly, `load_policy_file(path)` loads the file as the
controller does, and `xce_resize_plugin.testing.make_job` and `grow_host_view` build
the arguments the hooks receive.

A policy file and its tests, side by side in a site's repository (`pytest` runs them
as they are):

```python
# max_grow.py: the site policy, listed in [resize] policy_files
from xce_resize_plugin import GrowRequest, PolicyRejected, hookimpl


@hookimpl
def xce_resize_validate(job, request):
    if isinstance(request, GrowRequest) and request.max_add > 64:
        raise PolicyRejected("grows are limited to 64 tasks at a time")
```

```python
# test_max_grow.py: its tests
from pathlib import Path

import pytest

from xce_resize_plugin import GrowRequest, PolicyRejected, Principal

POLICY = Path(__file__).with_name("max_grow.py")


@pytest.fixture
def resize_config():
    # The [resize] section of every resize_* fixture in this module: the policy under test.
    return {"policy_files": [str(POLICY)]}


def test_a_grow_of_65_tasks_is_refused(resize_sim):
    job = resize_sim.submit("alice", "1,100", alloc={"hA": 1}, resizable=True, runtime=600)
    with pytest.raises(PolicyRejected, match="limited to 64"):
        resize_sim.request_resize(Principal("alice"), job, GrowRequest(65, 65))


def test_a_grow_of_8_tasks_is_placed(resize_sim):
    job = resize_sim.submit("alice", "1,100", alloc={"hA": 1}, resizable=True, runtime=600)
    resize_sim.request_resize(Principal("alice"), job, GrowRequest(8, 8))
    resize_sim.settle()
    assert len(resize_sim.job(job).tasks) == 9
    assert resize_sim.check_invariants() == []


def test_what_the_user_sees(resize_scenario):
    job = {"id": "1", "user": "alice", "tasks": "1,128", "alloc": {"hA": 1}, "resizable": True}
    result = resize_scenario(
        {
            "cluster": {"hosts": {"hA": 64, "hB": 64}},
            "jobs": [job],
            "commands": [
                {"at": 10, "user": "alice", "bresize": "request 65 1"},
                {"at": 20, "user": "alice", "bresize": "request 63 1"},
            ],
        }
    )
    refused, granted = result.commands
    assert refused.message == "Rejected by site policy: grows are limited to 64 tasks at a time"
    assert granted.exit == 0 and result.jobs["1"]["hosts"] == {"hA": 64}
```
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
    out.append(TESTING)
    return "".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
