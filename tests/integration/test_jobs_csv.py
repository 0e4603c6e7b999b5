"""``xce-resize simulate --jobs-out``: one CSV row per job and run, as documented."""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import pytest

from tests.integration.test_simulate import KTH200, cli
from xce_resize_plugin.simulation.jobs_csv import COLUMNS


def _rows(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        return list(reader)


@pytest.mark.parametrize("name", ["jobs.csv", "jobs.csv.gz"])
def test_jobs_out_has_a_row_per_job_and_run_that_adds_up_to_the_metrics(
    tmp_path: Path, name: str
) -> None:
    out = tmp_path / name
    proc = cli(
        str(KTH200),
        "--malleable-fraction",
        "0.5",
        "--json",
        str(tmp_path / "r.json"),
        "--jobs-out",
        str(out),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["run"] for r in rows] == ["rigid"] * 200 + ["elastic"] * 200
    for run in ("rigid", "elastic"):
        mine = [r for r in rows if r["run"] == run]
        assert len({r["job_id"] for r in mine}) == 200
        metrics = doc["runs"][run]
        waits = [float(r["wait"]) for r in mine]
        assert math.isclose(sum(waits) / len(waits), metrics["mean_wait"], rel_tol=1e-9)
        bsld = [float(r["bounded_slowdown"]) for r in mine]
        assert math.isclose(sum(bsld) / 200, metrics["mean_bounded_slowdown"], rel_tol=1e-9)
        assert sum(int(r["resizes"]) for r in mine) == metrics["resizes"]
        for r in mine:
            assert float(r["start"]) - float(r["submit"]) == float(r["wait"])
            assert int(r["min_tasks"]) <= int(r["tasks_at_start"]) <= int(r["max_tasks"])
    rigid = [r for r in rows if r["run"] == "rigid"]
    assert all(r["malleable"] == "0" and r["resizes"] == "0" for r in rigid)
    elastic = [r for r in rows if r["run"] == "elastic"]
    assert doc["trace"]["malleable_jobs"] == sum(r["malleable"] == "1" for r in elastic) > 0


@pytest.mark.parametrize(
    ("name", "message"),
    [("jobs.txt", "must end in .csv or .csv.gz"), ("missing/jobs.csv", "no directory")],
)
def test_a_bad_jobs_out_is_refused_before_running(tmp_path: Path, name: str, message: str) -> None:
    proc = cli(str(KTH200), "--jobs-out", str(tmp_path / name), "--no-progress")
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # nothing ran


def test_a_requeued_jobs_resizes_count_its_earlier_runs_too() -> None:
    """With host failures and a site that requeues, a job's ``resizes`` counts the
    commits of the runs a requeue ended as well as its last run's, so the column
    still adds up to the run's resizes (here 66, of which 16 in ended runs)."""
    from xce_resize_plugin.simulation import failures
    from xce_resize_plugin.simulation.comparison import simulate
    from xce_resize_plugin.simulation.simulate import SimOptions

    policy = Path(__file__).resolve().parents[2] / "hooks" / "requeue_on_host_failure.py"
    options = SimOptions(
        malleable_fraction=0.8,
        host_failures=failures.HostFailures(100.0),
        resize={"policy_files": [str(policy)], "max_requeue": 3},
    )
    result = simulate(KTH200, options, parallel=False, job_rows=True)
    assert result.problems == []
    elastic = result.elastic
    rows = [dict(zip(COLUMNS, row, strict=True)) for row in elastic.jobs]
    assert sum(int(r["requeues"]) for r in rows) > 0
    assert sum(int(r["resizes"]) for r in rows) == elastic.metrics.resizes > 0
