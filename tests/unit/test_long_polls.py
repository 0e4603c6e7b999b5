"""The fuzz tests' guard against long polls that hold the connection
(tests/long_polls.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.long_polls import never_hold, sent_values
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.rest.resize_operations import parse_timeout


class _Case:
    def __init__(self, query: Any) -> None:
        self.query = query


def _valid(text: str) -> bool:
    try:
        parse_timeout(text)
    except ResizeError:
        return False
    return True


SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
QUERIES = st.dictionaries(st.sampled_from(["timeout", "version", "x"]), VALUES) | VALUES


@given(QUERIES)
def test_a_guarded_case_sends_a_zero_wait_or_one_the_server_refuses(query: Any) -> None:
    case = _Case(query)
    never_hold(case, "timeout", _valid)
    sent = sent_values(case.query, "timeout")
    # Held only by one valid, non-zero wait (or none at all): neither may remain.
    assert sent, f"no timeout sent for {query!r}: the server's default wait applies"
    if len(sent) == 1:
        assert sent[0] == "0" or not _valid(sent[0]), f"{query!r} waits {sent[0]} s"
    if isinstance(query, dict):
        assert {k: v for k, v in case.query.items() if k != "timeout"} == {
            k: v for k, v in query.items() if k != "timeout"
        }, "the other parameters are kept"


def test_values_are_read_as_requests_sends_them() -> None:
    assert sent_values({"timeout": []}, "timeout") == []
    assert sent_values({"timeout": [None]}, "timeout") == []
    assert sent_values({"timeout": {}}, "timeout") == []
    assert sent_values({"timeout": [25]}, "timeout") == ["25"]
    assert sent_values({"timeout": {"25": 1}}, "timeout") == ["25"]
    assert sent_values({"timeout": [[5]]}, "timeout") == ["5"]
    assert sent_values({"timeout": [1, 2]}, "timeout") == ["1", "2"]


def test_a_held_case_waits_zero_and_a_refused_one_is_left_alone() -> None:
    for value in ([], {}, [25.0], ("7",), {"30": None}, [[5]], None):
        case = _Case({"timeout": value, "version": 1})
        never_hold(case, "timeout", _valid)
        assert case.query == {"timeout": 0, "version": 1}, value
    for value in (-1, "soon", [1, 2], True):
        case = _Case({"timeout": value})
        never_hold(case, "timeout", _valid)
        assert case.query == {"timeout": value}, value
