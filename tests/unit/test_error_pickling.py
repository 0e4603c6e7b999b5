"""Errors cross process boundaries (a sweep's worker processes, Dask workers) as
themselves: the same class, text, detail and attributes after pickling."""

from __future__ import annotations

import pickle

import pytest

from xce_resize_plugin.errors import ConfigError, JobNotResizable, ResizeError, UsageError
from xce_resize_plugin.rest.client import RemoteError
from xce_resize_plugin.simulation.simulate import SimulationError
from xce_resize_plugin.simulation.trace_types import TraceError


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("load=1e+300 cannot be reached"),
        SimulationError("cell x (elastic run): Configuration error: y"),
        UsageError(),
        JobNotResizable("job 7"),
        TraceError("malformed SWF data line", source="t.swf", line=4),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_unpickled_says_what_it_said(error: ResizeError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    # Before, the message was added again on the way back: "Configuration error:
    # Configuration error: ...".
    assert str(back) == str(error)
    assert (back.detail, back.text, back.args) == (error.detail, error.text, error.args)
    assert vars(back) == vars(error)


def test_a_remote_error_keeps_its_answer() -> None:
    error = RemoteError("LSBE_JOB_RESIZABLE", "Job is not resizable", 409, 357, retry_after=2)
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), str(back), vars(back)) == (RemoteError, str(error), vars(error))
