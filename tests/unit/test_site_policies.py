"""The example site policies in hooks/, each loaded the way a controller loads it."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import pytest

from xce_resize_plugin import errors
from xce_resize_plugin.core.models import (
    ChangeKind,
    GrowRequest,
    JobInfo,
    JobState,
    ReleaseRequest,
    ResizeRecord,
    Task,
)
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView
from xce_resize_plugin.manager import get_plugin_manager, load_policy_file

HOOKS = Path(__file__).resolve().parents[2] / "hooks"


def policy(name: str) -> ModuleType:
    return load_policy_file(HOOKS / name)


def job(alloc: dict[str, int], **kw: object) -> JobInfo:
    flat = [h for h, n in alloc.items() for _ in range(n)]
    fields: dict[str, object] = {
        "id": "7",
        "user": "alice",
        "state": JobState.RUN,
        "min_tasks": 1,
        "max_tasks": 64,
        "tasks": tuple(Task(i, h) for i, h in enumerate(flat)),
        "resizable": True,
    }
    fields.update(kw)
    return JobInfo(**fields)  # type: ignore[arg-type]


def test_every_example_loads_into_a_manager() -> None:
    files = sorted(str(p) for p in HOOKS.glob("*.py"))
    assert len(files) >= 3
    pm = get_plugin_manager({"policy_files": files}, entry_points=False)
    names = {n for n, _ in pm.list_name_plugin()}
    assert all(f"policy:{f}" in names for f in files)


def test_free_whole_hosts_empties_the_smallest_hosts_first() -> None:
    mod = policy("free_whole_hosts.py")
    j = job({"hA": 2, "hB": 3, "hC": 1, "hD": 2})
    candidates = [t for t in j.tasks if t.id != 0]
    chosen = mod.xce_resize_select_release(j, candidates, 3)
    hosts = [j.tasks[i].host for i in chosen]
    # hC (1 task) is emptied, then hD (2 tasks): two whole hosts freed by three tasks.
    assert sorted(hosts) == ["hC", "hD", "hD"]
    # the head host is taken last, and never its task 0
    chosen = mod.xce_resize_select_release(j, candidates, len(candidates))
    assert 0 not in chosen and len(chosen) == len(candidates)


def test_power_of_two_sizes() -> None:
    mod = policy("power_of_two.py")
    j = job({"hA": 2, "hB": 2})
    mod.xce_resize_validate(j, GrowRequest(4, 4))
    with pytest.raises(errors.PolicyRejected, match="exact grows"):
        mod.xce_resize_validate(j, GrowRequest(2, 4))
    with pytest.raises(errors.PolicyRejected, match="4 -> 6"):
        mod.xce_resize_validate(j, GrowRequest(2, 2))
    mod.xce_resize_validate(j, ReleaseRequest(spec="hB"))
    mod.xce_resize_validate(j, ReleaseRequest(count=2))
    mod.xce_resize_validate(j, ReleaseRequest(hosts={"hB": None}))
    with pytest.raises(errors.PolicyRejected, match="4 -> 3"):
        mod.xce_resize_validate(j, ReleaseRequest(task_ids=(3,)))


def test_pack_grow_hosts_prefers_fullest_hosts_with_room() -> None:
    mod = policy("pack_grow_hosts.py")
    j = job({"hA": 1})
    view = GrowHostView(FreeSlotIndex({"hA": 1, "hB": 8, "hC": 2, "hD": 0, "hE": 3}), {"hA": 1})
    assert list(mod.xce_resize_order_grow_hosts(j, view)) == ["hA", "hC", "hE", "hB"]


def test_resize_log_appends_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = policy("resize_log.py")
    log = tmp_path / "log.csv"
    monkeypatch.setenv("XCE_RESIZE_LOG", str(log))
    j = job({"hA": 2})
    rec = ResizeRecord(
        5.0, ChangeKind.GROW, j.tasks, (Task(2, "hB"),), (*j.tasks, Task(2, "hB")), 1
    )
    mod.xce_resize_committed(j, rec)
    mod.xce_resize_committed(j, rec)
    rows = list(csv.DictReader(log.open()))
    assert len(rows) == 2
    assert rows[0]["delta_hosts"] == "hB 1" and rows[0]["after"] == "3"
