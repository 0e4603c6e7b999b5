"""Counts and ids as decimal text (core/decimal_text.py), and the readers that use it:
text ``str.isdigit()`` takes but ``int()`` refuses is the caller's error, not a
traceback."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_resize_plugin.cli.jobs import parse_tasks
from xce_resize_plugin.controllers.jobs import job_id_key
from xce_resize_plugin.core.decimal_text import read_decimal, read_number
from xce_resize_plugin.errors import ConfigError, UsageError
from xce_resize_plugin.scenarios.files import load as load_scenario

#: Digits ``isdigit()`` accepts: a superscript two, which ``int()`` refuses, and an
#: Arabic-Indic one, which it reads.
ODD_DIGITS = ["\u00b2", "\u0661", "1\u00b2", "9" * 5000]


@given(st.text(max_size=25))
def test_read_decimal_reads_ascii_digits_only_and_never_raises(text: str) -> None:
    value = read_decimal(text)
    ascii_digits = text.isascii() and text.isdigit() and 1 <= len(text) <= 19
    assert (value is not None) == ascii_digits
    if value is not None:
        assert value == int(text) and 0 <= value < 10**19


@given(st.integers(0, 10**19 - 1))
def test_read_decimal_reads_every_64_bit_count(n: int) -> None:
    assert read_decimal(str(n)) == n


@pytest.mark.parametrize("text", ODD_DIGITS)
def test_odd_digits_are_the_readers_own_errors(text: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="-n takes N or MIN,MAX"):
        parse_tasks(f"1,{text}")
    assert job_id_key(text) == (1, 0, text)  # sorted after the numeric ids
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'[cluster]\nhosts = {{ h1 = 2 }}\n[[jobs]]\nid = "a"\nuser = "u"\ntasks = "1,{text}"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r'tasks: must be N or "MIN,MAX"'):
        load_scenario(scenario)
    scenario.write_text(
        f'[cluster]\nhosts = {{ h1 = 2 }}\n[[jobs]]\nid = "{text}"\nuser = "u"\ntasks = 1\n',
        encoding="utf-8",
    )
    load_scenario(scenario)  # an id like any other, not a number


@given(st.text(max_size=30))
def test_read_number_reads_plain_finite_decimals_only_and_never_raises(text: str) -> None:
    value = read_number(text)
    if value is not None:
        assert text.isascii() and value == float(text) and math.isfinite(value)
        assert "_" not in text and text.strip() == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_read_number_reads_every_finite_float_as_python_writes_it(x: float) -> None:
    assert read_number(repr(x)) == x


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999", "1_0", " 5", "\uff13", "0x10"])
def test_read_number_refuses_what_float_takes_but_no_one_means(text: str) -> None:
    assert read_number(text) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "t.swf", "--limit", "\uff13"], "argument --limit: not a whole number"),
        (["simulate", "t.swf", "--seed", "1_0"], "argument --seed: not a whole number"),
        (["simulate", "t.swf", "--malleable-fraction", "nan"], "not a finite decimal number"),
        (["simulate", "t.swf", "--malleable-fraction", "1e309"], "not a finite decimal number"),
        (["simulate", "t.swf", "--limit", "-1"], "argument --limit: not a whole number"),
        (["journal", "compact", "d", "--keep-days", "inf"], "--keep-days: not a finite decimal"),
        (["submit", "--grace", "\u0661", "--", "true"], "--grace: not a finite decimal number"),
        (["target", "7", "\u00b2"], "argument N: not a whole number"),
    ],
)
def test_command_line_numbers_are_ascii_decimals(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse's int and float took other scripts' digits, underscores and nan."""
    from xce_resize_plugin.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()  # one line, no usage above it
    assert line.startswith(f"xce-resize {argv[0]}") and message in line
