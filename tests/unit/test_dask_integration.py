"""The Dask integration refuses to run where it cannot work, with a message naming
why, before it touches the controller (its live behaviour: tests/e2e/live/test_live_dask.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed")

from xce_resize_plugin.integrations.dask import XCECluster
from xce_resize_plugin.integrations.dask.worker import main, parse_args

JOB = {"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9", "XCE_HEAD_ADDR": "h"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({**JOB, "XCE_TASK_ID": "3"}, "runs in task 0 of a job; this is task 3"),
        ({"XCE_JOB_ID": "7", "XCE_TASK_ID": "0"}, "XCE_HEAD_ADDR not set"),
    ],
)
def test_the_cluster_outside_task_0_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        XCECluster(environ=environ)


def test_an_unreachable_controller_fails_the_start_and_leaves_nothing_running() -> None:
    from xce_resize_plugin.errors import Unreachable

    environ = {**JOB, "XCE_HEAD_ADDR": "127.0.0.1", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"}
    with pytest.raises(Unreachable, match=r"127\.0\.0\.1:9"):
        XCECluster(environ=environ)


def test_the_worker_outside_a_job_or_in_task_0_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("XCE_JOB_ID", "XCE_CONTROLLER_URL", "XCE_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--wait", "0"]) == 1
    assert "runs in a job's tasks other than task 0" in capsys.readouterr().err
    monkeypatch.setenv("XCE_TASK_ID", "2")
    assert main(["--wait", "0"]) == 1
    assert "not inside an XCE job: XCE_JOB_ID, XCE_CONTROLLER_URL" in capsys.readouterr().err


def test_the_worker_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--nthreads", "0"], ["--wait", "-1"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        assert exit_.value.code == 2
        assert "--nthreads must be at least 1" in capsys.readouterr().err
