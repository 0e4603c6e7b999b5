"""``journal_defer``: transitions the host has not acted on are written with the next
one it acts on; the journal ends up with the same facts, in the same order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin import errors
from xce_resize_plugin.core import config
from xce_resize_plugin.core.models import GrowRequest, ReleaseRequest
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.journal.entries import Entry

from .harness import Harness

SIM = {"journal_sync": False, "journal_defer": True}


def _facts(state_dir: Path) -> list[tuple[str, str]]:
    with Journal.open(state_dir / "resize", readonly=True) as journal:
        return [(job, json.loads(p)["type"]) for _, job, p in journal.facts()]


def _life(tmp_path: Path, defer: bool, batch: int = 0) -> tuple[Harness, list[tuple[str, str]]]:
    config = {"journal_sync": False, "journal_defer": defer, "journal_batch": batch}
    h = Harness(tmp_path, config=config)
    h.ctl.submit("alice", "1,8", runtime=100, resizable=True, alloc={"hA": 2}, job_id="1")
    h.ctl.settle()
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))
    h.request("alice", "1", ReleaseRequest(count=1, no_notify=True))
    h.ctl.run(until=200)
    usage = h.ctl.acct_usage("1")  # the job ended: read back from the journal
    assert usage is not None and usage.slot_seconds > 0
    return h, _facts(tmp_path)


def test_deferred_writes_leave_the_same_journal(tmp_path: Path) -> None:
    plain, facts = _life(tmp_path / "plain", defer=False)
    deferred, same = _life(tmp_path / "deferred", defer=True)
    assert same == facts and len(facts) > 8
    assert deferred.ctl.acct_usage("1") == plain.ctl.acct_usage("1")


@pytest.mark.parametrize("batch", [1, 3, 1024])
def test_batched_writes_leave_the_same_journal(tmp_path: Path, batch: int) -> None:
    plain, facts = _life(tmp_path / "plain", defer=False)
    batched, same = _life(tmp_path / "batched", defer=True, batch=batch)
    assert same == facts and len(facts) > 8
    assert batched.ctl.acct_usage("1") == plain.ctl.acct_usage("1")


def _two_jobs(tmp_path: Path, config: dict[str, Any]) -> dict[str, list[str]]:
    h = Harness(tmp_path, config=config)
    for n in ("1", "2"):
        h.ctl.submit("alice", "1,8", runtime=100, resizable=True, alloc={"hA": 2}, job_id=n)
    h.ctl.settle()
    for n in ("1", "2"):
        h.request("alice", n, GrowRequest(2, 2, no_notify=True))
    h.ctl.settle()
    for n in ("2", "1"):
        h.request("alice", n, ReleaseRequest(count=1, no_notify=True))
    h.ctl.run(until=200)
    h.ctl.stop()
    out: dict[str, list[str]] = {}
    for job, kind in _facts(tmp_path):
        out.setdefault(job, []).append(kind)
    return out


def test_a_batch_keeps_each_jobs_facts_in_order(tmp_path: Path) -> None:
    """Each job's facts are those of a plain run, in their order (a batch writes one
    entry per job, so different jobs' facts may interleave otherwise)."""
    plain = _two_jobs(tmp_path / "plain", {})
    batched = _two_jobs(tmp_path / "batched", {**SIM, "journal_batch": 1024})
    assert batched == plain and len(plain["1"]) > 8


def test_a_batch_waits_until_it_is_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With journal_batch, effects go ahead of the write (a reservation, a launch, a
    commit), and the journal is written once the batch holds that many entries."""
    sizes: list[int] = []
    commit = Journal.commit

    def recorded(self: Journal, entries: Sequence[Entry]) -> Any:
        sizes.append(len(entries))
        return commit(self, entries)

    monkeypatch.setattr(Journal, "commit", recorded)
    h = Harness(tmp_path, config={**SIM, "journal_batch": 3})
    for n in range(1, 5):
        h.ctl.submit("alice", "1,4", runtime=100, resizable=True, alloc={"hA": 1}, job_id=str(n))
    h.ctl.settle()
    for n in range(1, 5):
        h.request("alice", str(n), GrowRequest(1, 1, no_notify=True))
    h.ctl.settle()  # four grows placed, launched, started and committed: all acted on
    assert all(len(h.ctl.resize_status(str(n)).tasks) == 2 for n in range(1, 5))  # type: ignore[union-attr]
    assert sizes and set(sizes) == {3}
    written = sum(sizes)
    h.ctl.stop()
    assert sizes[-1] < 3 and sum(sizes) > written  # the rest, at the clean stop
    facts = _facts(tmp_path)
    assert [t for j, t in facts if j == "4"][-1] == "Committed"


def test_journal_batch_needs_journal_defer() -> None:
    with pytest.raises(errors.ConfigError, match="journal_batch needs journal_defer = true"):
        config.check({"journal_sync": False, "journal_batch": 8})
    with pytest.raises(errors.ConfigError, match="journal_batch must be at least 0"):
        config.check({**SIM, "journal_batch": -1})
    assert config.check({**SIM, "journal_batch": 8})["journal_batch"] == 8


def test_an_accepted_request_waits_for_the_next_write(tmp_path: Path) -> None:
    h = Harness(tmp_path, config=SIM)
    h.ctl.submit("alice", "1,8", runtime=100, resizable=True, alloc={"hA": 2}, job_id="1")
    h.ctl.settle()
    h.ctl.submit("bob", 14, runtime=100, job_id="2")  # the other slots: the grow pends
    h.ctl.settle()
    before = h.journal_seq()
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))
    assert h.ctl.resize_status("1").pending is not None  # type: ignore[union-attr]
    assert h.journal_seq() == before  # nothing the host acted on yet
    h.ctl.kill("2")
    h.ctl.settle()  # placed: the reservation is an effect, so everything is written
    assert _facts(tmp_path) == [
        ("1", "JobTracked"),
        ("1", "GrowRequested"),
        ("1", "GrowPlaced"),
        ("1", "TasksLaunched"),
        ("1", "TasksStarted"),  # the two starts, reported together
        ("1", "Committed"),
    ]


def test_a_transition_written_after_its_deferred_one_is_one_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's deferred transition and its next written one become one entry (one
    state written): the facts stay the same, in the same order."""
    batches: list[list[tuple[str, list[str]]]] = []
    commit = Journal.commit

    def recorded(self: Journal, entries: Sequence[Entry]) -> Any:
        batches.append([(e.job_id, [json.loads(f)["type"] for f in e.facts]) for e in entries])
        return commit(self, entries)

    monkeypatch.setattr(Journal, "commit", recorded)
    h = Harness(tmp_path, config=SIM)
    h.ctl.submit("alice", "1,8", runtime=100, resizable=True, alloc={"hA": 2}, job_id="1")
    h.ctl.submit("bob", 14, runtime=100, job_id="2")
    h.ctl.settle()
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))
    h.ctl.kill("2")
    h.ctl.settle()
    assert batches == [
        [("1", ["JobTracked", "GrowRequested", "GrowPlaced"])],
        [("1", ["TasksLaunched", "TasksStarted", "Committed"])],
    ]
    state = h.ctl.resize_status("1")
    assert state is not None and len(state.tasks) == 4


def test_journal_defer_needs_journal_sync_off() -> None:
    with pytest.raises(errors.ConfigError, match="journal_defer needs journal_sync = false"):
        config.check({"journal_defer": True})
    assert config.check(SIM)["journal_defer"] is True


def test_a_clean_stop_writes_what_was_deferred(tmp_path: Path) -> None:
    h = Harness(tmp_path, config=SIM)
    h.ctl.submit("alice", "1,8", runtime=100, resizable=True, alloc={"hA": 2}, job_id="1")
    h.ctl.submit("bob", 14, runtime=100, job_id="2")
    h.ctl.settle()
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))  # pends: nothing written
    assert _facts(tmp_path) == []
    h.ctl.stop()
    assert _facts(tmp_path) == [("1", "JobTracked"), ("1", "GrowRequested")]
