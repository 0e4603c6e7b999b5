"""The [resize] section: defaults, and every bad value named."""

from __future__ import annotations

from pathlib import Path

import pytest

from xce_resize_plugin import errors
from xce_resize_plugin.core import config


def test_defaults() -> None:
    values = config.check({})
    assert values["notify_timeout"] == 60.0 and values["notify_max_failures"] == 3
    s = config.settings({"notify_max_failures": 5, "stop_grace": 0})
    assert s.notify_max_failures == 5 and s.stop_grace == 0.0


@pytest.mark.parametrize(
    ("section", "expect"),
    [
        ({"notify_timout": 5}, "unknown key 'notify_timout'"),
        ({"notify_timeout": "5"}, "notify_timeout must be int or float"),
        ({"notify_timeout": 0}, "notify_timeout must be at least"),
        ({"notify_max_failures": 0}, "notify_max_failures must be between 1 and 100, got 0"),
        ({"notify_max_failures": 2.5}, "notify_max_failures must be int"),
        ({"allow_grow": 1}, "allow_grow must be bool"),
        ({"stop_grace": True}, "stop_grace must be int or float"),
        ({"policy_files": "x.py"}, "policy_files must be list"),
        ({"policy_files": ["a.py", 1]}, "policy_files entries must be paths, got 1"),
        ({"stop_grace": float("nan")}, "stop_grace must be a finite number, got nan"),
        ({"notify_timeout": float("inf")}, "notify_timeout must be a finite number, got inf"),
    ],
)
def test_bad_values_are_named(section: dict[str, object], expect: str) -> None:
    with pytest.raises(errors.ConfigError, match=expect):
        config.check(section)


def test_not_a_table() -> None:
    with pytest.raises(errors.ConfigError, match="must be a table"):
        config.check([])  # type: ignore[arg-type]


def test_the_journal_map_size_limit_is_the_journals_growth_limit() -> None:
    """core/config.py does not import LMDB; the two limits must not drift apart."""
    from xce_resize_plugin.journal.lmdb_env import MAX_MAP_SIZE

    assert config.MAX_JOURNAL_MAP_SIZE == MAX_MAP_SIZE == 1 << 40
    assert config.check({"journal_map_size": MAX_MAP_SIZE})["journal_map_size"] == MAX_MAP_SIZE
    assert config.check({"journal_map_size": 1 << 20})["journal_map_size"] == 1 << 20


@pytest.mark.parametrize("size", [(1 << 40) + 1, 1 << 62, 1 << 64, (1 << 20) - 1, 0, -1])
def test_a_journal_map_size_out_of_range_is_a_configuration_error(size: int) -> None:
    """2**64 was an OverflowError traceback from LMDB and 2**62 a MemoryError blamed
    on the journal's file, after the live controller had made its state directory."""
    with pytest.raises(errors.ConfigError) as refused:
        config.check({"journal_map_size": size}, where="site.toml: [resize]")
    assert str(refused.value) == (
        "Configuration error: site.toml: [resize] journal_map_size must be between "
        f"1048576 and 1099511627776, got {size}"
    )


def test_notify_max_failures_is_at_most_100() -> None:
    assert config.check({"notify_max_failures": 100})["notify_max_failures"] == 100
    with pytest.raises(errors.ConfigError) as err:
        config.check({"notify_max_failures": 1000}, where="site.toml: [resize]")
    assert err.value.text == (
        "Configuration error: site.toml: [resize] notify_max_failures must be between "
        "1 and 100, got 1000"
    )


def test_a_notification_failing_the_most_times_allowed_settles(tmp_path: Path) -> None:
    """A simulated controller retries a failing notification at the same instant: at
    1,000 failures allowed a scenario stopped with SettleLoopError. At the bound, the
    grow is given up and the scenario ends."""
    from xce_resize_plugin.scenarios import files, runner

    text = (Path(__file__).parents[1] / "data" / "scenarios" / "grow_limits.toml").read_text()
    text = text.replace("notify_max_failures = 2", "notify_max_failures = 100")
    text = text.replace('[[commands]]\nat = 7\nuser = "dave"\nbresize = "cancel 222"\n', "")
    assert "cancel 222" not in text
    path = tmp_path / "s.toml"
    path.write_text(text)
    result = runner.run(files.load(path), tmp_path / "state")
    assert result.problems == ()
    tried = [n for n in result.notifications if n["job"] == "222"]
    assert len(tried) == 100
