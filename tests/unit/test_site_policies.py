"""The example site policies in hooks/, each loaded the way a controller loads it."""

from __future__ import annotations

import ast
import csv
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from xce_resize_plugin import (
    AutoresizeRequest,
    ChangeKind,
    GrowRequest,
    InvalidRequest,
    JobState,
    PolicyRejected,
    Principal,
    ReleaseRequest,
    ResizeError,
    ResizeRecord,
    TargetRequest,
    Task,
    get_plugin_manager,
    load_policy_file,
    release_size,
)
from xce_resize_plugin.testing import grow_host_view
from xce_resize_plugin.testing import make_job as job

HOOKS = Path(__file__).resolve().parents[2] / "hooks"


def policy(name: str) -> ModuleType:
    return load_policy_file(HOOKS / name)


def _imports(path: Path) -> list[str]:
    """Every module a file imports from (``import x.y`` and ``from x.y import z``)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append("." * node.level + (node.module or ""))
    return out


@pytest.mark.parametrize("path", sorted(HOOKS.glob("*.py")), ids=lambda p: p.name)
def test_examples_import_only_the_public_api(path: Path) -> None:
    """A site copies these files: they use only what the package declares public."""
    ours = [m for m in _imports(path) if m.split(".")[0] == "xce_resize_plugin" or m[:1] == "."]
    assert ours, f"{path.name} imports nothing from xce_resize_plugin"
    assert set(ours) == {"xce_resize_plugin"}, f"{path.name} imports {sorted(set(ours))}"


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
    with pytest.raises(PolicyRejected, match="exact grows"):
        mod.xce_resize_validate(j, GrowRequest(2, 4))
    with pytest.raises(PolicyRejected, match="4 -> 6"):
        mod.xce_resize_validate(j, GrowRequest(2, 2))
    mod.xce_resize_validate(j, ReleaseRequest(spec="hB"))
    mod.xce_resize_validate(j, ReleaseRequest(count=2))
    mod.xce_resize_validate(j, ReleaseRequest(hosts={"hB": None}))
    with pytest.raises(PolicyRejected, match="4 -> 3"):
        mod.xce_resize_validate(j, ReleaseRequest(task_ids=(3,)))
    # A target and autoresize went around it (a target of 6 grew the job to 6 tasks;
    # and even one of 8 stops at 6 when only 2 slots are free: its grows are partial).
    mod.xce_resize_validate(j, TargetRequest(None))  # clearing a target
    for tasks in (6, 8):
        with pytest.raises(PolicyRejected, match="does not allow targets"):
            mod.xce_resize_validate(j, TargetRequest(tasks))
    with pytest.raises(PolicyRejected, match="does not allow autoresize"):
        mod.xce_resize_validate(j, AutoresizeRequest(True))
    mod.xce_resize_validate(j, AutoresizeRequest(False))


def test_pack_grow_hosts_prefers_fullest_hosts_with_room() -> None:
    mod = policy("pack_grow_hosts.py")
    j = job({"hA": 1})
    view = grow_host_view({"hA": 1, "hB": 8, "hC": 2, "hD": 0, "hE": 3}, {"hA": 1})
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
    with log.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    assert rows[0]["delta_hosts"] == "hB 1" and rows[0]["after"] == "3"


@pytest.mark.parametrize(
    "resize_config", [{"policy_files": [str(HOOKS / "power_of_two.py")]}], ids=["power_of_two"]
)
def test_power_of_two_on_the_simulated_controller(resize_sim: Any) -> None:
    """The policy as the controller loads it (``resize_sim`` with ``resize_config``)."""
    alice = Principal("alice")
    job_id = resize_sim.submit("alice", "1,16", alloc={"hA": 2}, resizable=True, runtime=600)
    with pytest.raises(PolicyRejected, match="2 -> 3"):
        resize_sim.request_resize(alice, job_id, GrowRequest(1, 1))
    resize_sim.request_resize(alice, job_id, GrowRequest(2, 2))
    resize_sim.settle()
    assert len(resize_sim.job(job_id).tasks) == 4
    with pytest.raises(PolicyRejected, match="4 -> 3"):
        resize_sim.request_resize(alice, job_id, ReleaseRequest(count=1))
    assert resize_sim.check_invariants() == []


def test_release_size_counts_every_form() -> None:
    j = job({"hA": 2, "hB": 3})
    assert release_size(ReleaseRequest(count=2), j.tasks) == 2
    assert release_size(ReleaseRequest(spec="hB"), j.tasks) == 3
    assert release_size(ReleaseRequest(spec="all ~hB"), j.tasks) == 1
    assert release_size(ReleaseRequest(hosts={"hB": 2}), j.tasks) == 2
    assert release_size(ReleaseRequest(task_ids=(1, 4)), j.tasks) == 2
    with pytest.raises(InvalidRequest, match="exactly one of"):
        release_size(ReleaseRequest(count=1, spec="hB"), j.tasks)
    with pytest.raises(ResizeError, match="not part of the job's allocation"):
        release_size(ReleaseRequest(spec="hC"), j.tasks)


def test_reclaim_owner_first_asks_the_heads_owner_first() -> None:
    from xce_resize_plugin import ReclaimCandidate, ReclaimHead

    mod = policy("reclaim_owner_first.py")
    head = ReclaimHead(job({}, id="9", user="bob", state=JobState.PEND), 2, None, {"hC": 1})

    def cand(job_id: str, user: str, alloc: dict[str, int], minimum: int) -> ReclaimCandidate:
        j = job(alloc, id=job_id, user=user, min_tasks=minimum)
        return ReclaimCandidate(j, j.tasks[1:], len(j.tasks) - minimum)

    ann = cand("1", "ann", {"hA": 4}, 1)  # 3 above its minimum
    bob = cand("2", "bob", {"hB": 3}, 2)  # 1 above
    # bob's own job gives its newest task, though ann's is further above its minimum.
    assert mod.xce_resize_select_reclaim(head, [ann, bob]) == {"2": [2]}
    # Loaded into a manager, it overrides the built-in choice (ann's newest task).
    pm = get_plugin_manager({"policy_files": [str(HOOKS / "reclaim_owner_first.py")]})
    assert pm.hook.xce_resize_select_reclaim(head=head, candidates=[ann, bob]) == {"2": [2]}
    plain = get_plugin_manager({}, entry_points=False)
    assert plain.hook.xce_resize_select_reclaim(head=head, candidates=[ann, bob]) == {"1": [3]}


def test_hook_xce_resize_host_lost_requeue_example() -> None:
    """The example requeues unless the job opts out; the built-in default exits."""
    from xce_resize_plugin.policy import HookPolicy

    requeue = policy("requeue_on_host_failure.py")
    running = job({"hA": 2, "hB": 2})
    assert requeue.xce_resize_host_lost(job=running, lost_task_ids=[2, 3]) == "requeue"
    opted_out = job({"hA": 2}, env={"XCE_RERUNNABLE": "n"})
    assert requeue.xce_resize_host_lost(job=opted_out, lost_task_ids=[0]) is None
    with_example = HookPolicy(
        get_plugin_manager({"policy_files": [str(HOOKS / "requeue_on_host_failure.py")]})
    )
    assert with_example.host_lost(opted_out, [0]) == "exit"  # the default decided
    assert with_example.host_lost(running, [2, 3]) == "requeue"
    assert HookPolicy(get_plugin_manager({})).host_lost(running, [2, 3]) == "exit"
