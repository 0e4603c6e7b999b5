"""``--host-failures``: the spec shown is the one simulated, and reads back to it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation.failures import (
    MAX_HOURS,
    MIN_HOURS,
    HostFailures,
    parse,
)
from xce_resize_plugin.simulation.simulate import SimOptions

hours = st.floats(min_value=MIN_HOURS, max_value=MAX_HOURS)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("200", "200:1"),
        ("200:2", "200:2"),
        ("2.0000004", "2.0000004:1"),  # was "2:1" (%g keeps 6 digits)
        ("0.1:0.25", "0.1:0.25"),
        ("1e3:.5", "1000:0.5"),
        ("123456.789", "123456.789:1"),  # was "123457:1"
    ],
)
def test_the_spec_shows_the_exact_values(text: str, spec: str) -> None:
    failures = parse(text)
    assert failures.spec() == spec
    assert SimOptions(host_failures=failures).to_json()["host_failures"] == spec


@given(mtbf=hours, repair=hours)
def test_the_spec_reads_back_to_the_same_values(mtbf: float, repair: float) -> None:
    failures = HostFailures(mtbf, repair)
    assert parse(failures.spec()) == failures


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("soon", "MTBF_HOURS must be a number, got 'soon'"),
        ("1_000", "MTBF_HOURS must be a number"),
        ("\uff11", "MTBF_HOURS must be a number"),  # a fullwidth 1: float() takes it
        (" 5", "MTBF_HOURS must be a number"),
        ("inf", "MTBF_HOURS must be a number"),
        ("1e400", "MTBF_HOURS must be a positive finite number"),
        ("-1", "MTBF_HOURS must be a positive finite number"),
        ("1e-300", "MTBF_HOURS must be between 1/3600 (one second) and 2,777,777 hours"),
        ("1e7", "MTBF_HOURS must be between"),
        ("5:0.0001", "REPAIR_HOURS must be between"),
    ],
)
def test_a_bad_spec_says_what_is_wrong_and_leaves_where_to_the_caller(
    text: str, message: str
) -> None:
    """The caller names the option or the file's key (tests/integration/
    test_simulate_inputs.py); the parser's own text does not name either."""
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.detail is not None
    assert info.value.detail.startswith(message), info.value.detail
    assert "--host-failures" not in info.value.detail


def test_the_bounds_themselves_are_taken() -> None:
    assert parse(f"{MIN_HOURS!r}:{MAX_HOURS!r}") == HostFailures(MIN_HOURS, MAX_HOURS)
