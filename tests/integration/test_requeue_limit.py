"""``[resize] max_requeue``: a job that host failures end is requeued at most that many
times (LSF's ``MAX_JOB_REQUEUE``), then ends ``EXIT``; the host counts the requeues
(``JobInfo.requeues``). docs/failover.md, "A requeued job"."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.integration.harness import Harness
from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.core import config
from xce_resize_plugin.core.audit import replay_problems
from xce_resize_plugin.core.models import JobState, LossOutcome
from xce_resize_plugin.errors import ConfigError

POLICY = str(Path(__file__).resolve().parents[2] / "hooks" / "requeue_on_host_failure.py")


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_a_job_is_requeued_at_most_max_requeue_times(
    tmp_path: Path, limit: int, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(
        tmp_path,
        hosts=[("hA", 2), ("hB", 2)],
        config={"policy_files": [POLICY], "max_requeue": limit},
    )
    # A rigid job on both hosts: every failure of hB takes tasks it cannot lose.
    job = h.ctl.submit("alice", "4", runtime=1000, alloc={"hA": 2, "hB": 2})
    h.ctl.settle()
    outcomes = []
    counts = []
    with caplog.at_level(logging.WARNING, logger="xce_resize_plugin"):
        while h.ctl.job(job).state is JobState.RUN and len(outcomes) < limit + 2:
            info = h.ctl.get_job(job)
            assert info is not None
            counts.append(info.requeues)
            outcomes.append(h.ctl.host_down("hB").outcomes[job])
            h.ctl.host_up("hB")
            h.ctl.settle()
    assert outcomes == [LossOutcome.REQUEUE] * limit + [LossOutcome.EXIT]
    assert counts == list(range(limit + 1))  # the host counted every requeue
    view = h.ctl.job(job)
    assert view.state is JobState.EXIT and view.exit_reason == HOST_FAILURE
    assert view.requeued is (limit > 0)
    said = [r.getMessage() for r in caplog.records if "max_requeue" in r.getMessage()]
    assert said == [
        f"job {job}: not requeued: requeued {limit} time(s), the most max_requeue allows "
        f"({limit}); the job ends"
    ]
    assert h.ctl.check_invariants() == []
    h.ctl.close()
    assert replay_problems(tmp_path / "resize") == []


@pytest.mark.parametrize("limit", [0, 5])
def test_without_a_site_policy_the_limit_changes_nothing(
    tmp_path: Path, limit: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The default policy ends the job at the first failure, whatever the limit, and
    nothing is said about a requeue nobody asked for."""
    h = Harness(tmp_path, hosts=[("hA", 2), ("hB", 2)], config={"max_requeue": limit})
    job = h.ctl.submit("alice", "4", runtime=1000, alloc={"hA": 2, "hB": 2})
    h.ctl.settle()
    with caplog.at_level(logging.WARNING, logger="xce_resize_plugin"):
        assert h.ctl.host_down("hB").outcomes == {job: LossOutcome.EXIT}
    assert [r.getMessage() for r in caplog.records if "requeue" in r.getMessage()] == []
    h.ctl.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "[resize] max_requeue must be at least 0, got -1"),
        (1.5, "[resize] max_requeue must be int, got 1.5"),
        (True, "[resize] max_requeue must be int, got True"),
    ],
)
def test_a_bad_limit_is_refused_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.check({"max_requeue": value})
    assert str(info.value) == f"Configuration error: {message}"
    assert config.check({})["max_requeue"] == 3


def test_the_count_survives_a_controller_restart(tmp_path: Path) -> None:
    """The embedded controller keeps the count in its store: a restart between two
    failures does not give the job its requeues back."""
    h = Harness(
        tmp_path,
        hosts=[("hA", 2), ("hB", 2)],
        config={"policy_files": [POLICY], "max_requeue": 1},
    )
    job = h.ctl.submit("alice", "4", runtime=1000, alloc={"hA": 2, "hB": 2})
    h.ctl.settle()
    assert h.ctl.host_down("hB").outcomes == {job: LossOutcome.REQUEUE}
    h.ctl.host_up("hB")
    h.ctl.settle()
    h.crash_and_restart()
    info = h.ctl.get_job(job)
    assert info is not None and info.requeued and info.requeues == 1
    assert h.ctl.host_down("hB").outcomes == {job: LossOutcome.EXIT}
    h.ctl.close()


def test_a_store_record_from_before_the_count_reads_as_requeued_once() -> None:
    from xce_resize_plugin.controllers.jobs import JobRecord
    from xce_resize_plugin.controllers.store import decode_job, encode_job

    record = JobRecord(
        id="5", user="alice", min_tasks=1, max_tasks=1, submit_time=0.0, runtime=10.0
    )
    record.requeued, record.requeues = True, 2
    assert decode_job(encode_job(record, {}))[0].requeues == 2
    for requeued, count in ((True, 1), (False, 0)):
        old = json.loads(encode_job(record, {}))
        del old["requeues"]
        old["requeued"] = requeued
        assert decode_job(json.dumps(old).encode())[0].requeues == count
