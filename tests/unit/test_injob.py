"""The in-job API's import path stays standard-library only, and its errors are clear."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from xce_resize_plugin.injob import Allocation, ResizeClient

PROBE = """
import json, sys
before = set(sys.modules)
import xce_resize_plugin.injob
print(json.dumps(sorted(m for m in set(sys.modules) - before
      if m.split('.')[0] in ('attrs', 'attr', 'cattrs', 'pluggy', 'lmdb', 'starlette'))))
"""


def test_import_is_standard_library_only() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_from_env_outside_a_job_says_what_is_missing() -> None:
    with pytest.raises(RuntimeError, match="XCE_JOB_ID, XCE_CONTROLLER_URL"):
        ResizeClient.from_env({})


def test_release_needs_exactly_one_form() -> None:
    client = ResizeClient.from_env({"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"})
    with pytest.raises(ValueError, match="exactly one"):
        client.release(count=1, task_ids=[3])
    with pytest.raises(ValueError, match="exactly one"):
        client.release()


def test_unreachable_controller_names_the_url() -> None:
    from xce_resize_plugin.rest.client import Unreachable

    client = ResizeClient.from_env({"XCE_JOB_ID": "7", "XCE_CONTROLLER_URL": "http://127.0.0.1:9"})
    with pytest.raises(Unreachable, match=r"127\.0\.0\.1:9"):
        client.allocation()


def test_allocation_from_json() -> None:
    alloc = Allocation.from_json(
        {
            "job_id": "7",
            "phase": "IDLE",
            "version": 2,
            "min_tasks": 1,
            "max_tasks": 8,
            "tasks": [{"id": 0, "host": "a"}, {"id": 3, "host": "b"}, {"id": 4, "host": "a"}],
            "pending": None,
            "in_flight": None,
        }
    )
    assert alloc.hosts == {"a": 2, "b": 1} and alloc.size == 3 and alloc.settled
