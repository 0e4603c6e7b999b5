"""The embedded controller's ``loss_ender``: a host whose jobs have processes on other
hosts (the live controller) ends or requeues a job that a host failure ends only after
stopping them; meanwhile the job runs on with its lost tasks exited and unheld
(docs/failover.md, "Host failure")."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import Harness
from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.controllers.task_records import TaskState
from xce_resize_plugin.core.audit import replay_problems
from xce_resize_plugin.core.models import JobState, LossOutcome

HOSTS = [("hA", 2), ("hB", 2), ("hC", 2)]
ROOT = Path(__file__).resolve().parents[2]
REQUEUE = str(ROOT / "hooks" / "requeue_on_host_failure.py")


def _harness(tmp_path: Path, ended: list[tuple[str, LossOutcome]], **kw: object) -> Harness:
    return Harness(
        tmp_path, hosts=HOSTS, loss_ender=lambda job, outcome: ended.append((job, outcome)), **kw
    )


def test_the_job_runs_on_until_its_ender_ends_it(tmp_path: Path) -> None:
    ended: list[tuple[str, LossOutcome]] = []
    h = _harness(tmp_path, ended)
    rigid = h.ctl.submit("bob", 2, runtime=1000, alloc={"hA": 1, "hB": 1})
    h.ctl.settle()
    assert h.ctl.host_down("hB").outcomes == {rigid: LossOutcome.EXIT}
    h.ctl.settle()
    assert ended == [(rigid, LossOutcome.EXIT)]
    record = h.ctl.record(rigid)
    assert record is not None and record.state is JobState.RUN
    states = {tid: (r.state, r.reason) for tid, r in record.task_states.items()}
    assert states[0][0] is TaskState.RUNNING
    assert states[1] == (TaskState.EXITED, HOST_FAILURE)
    # The lost task's slot is free at the failure instant; task 0's is held until the
    # ender has stopped it.
    assert h.ctl.hosts_view()["hB"]["used"] == 0 and h.ctl.hosts_view()["hA"]["used"] == 1
    assert h.ctl.check_invariants() == []
    h.ctl.stop_tasks(rigid, [0], 1.0)
    h.ctl.settle()
    assert h.ctl.kill(rigid, HOST_FAILURE)
    job = h.ctl.job(rigid)
    assert job.state is JobState.EXIT and job.exit_reason == HOST_FAILURE
    assert h.ctl.hosts_view()["hA"]["used"] == 0
    assert h.ctl.check_invariants() == []


def test_a_requeue_waits_for_the_ender_too(tmp_path: Path) -> None:
    ended: list[tuple[str, LossOutcome]] = []
    h = _harness(tmp_path, ended, config={"policy_files": [REQUEUE]})
    rigid = h.ctl.submit("bob", 2, runtime=1000, alloc={"hA": 1, "hB": 1})
    h.ctl.settle()
    assert h.ctl.host_down("hB").outcomes == {rigid: LossOutcome.REQUEUE}
    assert ended == [(rigid, LossOutcome.REQUEUE)]
    assert h.ctl.job(rigid).state is JobState.RUN
    assert h.ctl.check_invariants() == []
    assert h.ctl.requeue(rigid)
    h.ctl.settle()
    # Back in the queue, then started again from scratch on the hosts that take tasks.
    job = h.ctl.job(rigid)
    assert job.state is JobState.RUN and job.version == 0
    assert len(job.tasks) == 2 and "hB" not in {t.host for t in job.tasks}
    h.ctl.kill(rigid)
    assert not h.ctl.requeue(rigid)  # not running: nothing to requeue
    assert h.ctl.check_invariants() == []
    h.ctl.close()
    assert replay_problems(tmp_path / "resize") == []


def test_an_ender_that_is_killing_the_job_answers_exit_and_the_plugin_lets_go(
    tmp_path: Path,
) -> None:
    """The live controller's case of a failure during a kill: the plugin, asked by the
    site's policy, ended the run for a requeue and holds it; the ender says the kill
    stands (``exit``), and the job's end then lets the hold go. The runtime finds the
    held state although the host never requeued the job (``JobInfo.requeued`` false):
    the end used to fail with "JobEnded for untracked job"."""
    from xce_resize_plugin.core.models import GrowRequest
    from xce_resize_plugin.journal import compaction
    from xce_resize_plugin.journal.verification import verify

    ended: list[tuple[str, LossOutcome]] = []

    def killing(job: str, outcome: LossOutcome) -> LossOutcome:
        ended.append((job, outcome))
        return LossOutcome.EXIT

    h = Harness(tmp_path, hosts=HOSTS, config={"policy_files": [REQUEUE]}, loss_ender=killing)
    job = h.ctl.submit("bob", "1,4", resizable=True, runtime=1000, alloc={"hA": 1, "hB": 1})
    h.ctl.settle()
    h.request("bob", job, GrowRequest(1, 1, no_notify=True))  # tracked by the plugin now
    assert h.ctl.host_down("hA").outcomes == {job: LossOutcome.EXIT}  # task 0's host
    assert ended == [(job, LossOutcome.REQUEUE)]  # the policy's answer, overruled
    for t in h.ctl.record(job).task_states:  # type: ignore[union-attr]
        h.ctl.stop_tasks(job, [t], 1.0)
    h.ctl.settle()
    assert h.ctl.kill(job, "killed by bob")
    view = h.ctl.job(job)
    assert view.state is JobState.EXIT and not view.requeued and view.requeues == 0
    assert h.ctl.check_invariants() == []
    h.ctl.close()
    journal = tmp_path / "resize"
    assert verify(journal).ok and replay_problems(journal) == []
    assert compaction.compact(journal, keep_days=0, now=1e10) > 0  # nothing held
