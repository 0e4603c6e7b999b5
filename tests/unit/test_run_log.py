"""The warnings a simulated run counts instead of printing (simulation/run_log.py)."""

from __future__ import annotations

import logging

from xce_resize_plugin.simulation.run_log import LogSummary, LogTally, tally_warnings


def test_records_are_counted_by_logger_and_pattern_and_keep_the_first() -> None:
    log = logging.getLogger("xce_resize_plugin.runtime.test_run_log")
    other = logging.getLogger("xce_resize_plugin.other_test_run_log")
    with tally_warnings() as tally:
        for job in ("7", "3", "9"):
            log.warning("job %s: not requeued", job)
        other.warning("job %s: not requeued", "1")
        log.error("journal %s full", "/x")
        log.info("job %s: ignored below warnings", "5")
    assert tally.summaries() == (
        LogSummary(3, log.name, "job %s: not requeued", "job 7: not requeued"),
        LogSummary(1, other.name, "job %s: not requeued", "job 1: not requeued"),
        LogSummary(1, log.name, "journal %s full", "journal /x full"),
    )
    assert tally.summaries()[0].to_json() == {
        "count": 3,
        "logger": log.name,
        "pattern": "job %s: not requeued",
        "first": "job 7: not requeued",
    }


def test_the_tally_leaves_with_the_block() -> None:
    log = logging.getLogger("xce_resize_plugin.test_run_log_leave")
    with tally_warnings() as tally:
        log.warning("counted")
    log.warning("after the block")
    assert [s.first for s in tally.summaries()] == ["counted"]
    assert not any(isinstance(h, LogTally) for h in logging.getLogger("xce_resize_plugin").handlers)


def test_a_programs_own_handlers_still_receive_every_record() -> None:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root = logging.getLogger()
    keep = Keep(logging.WARNING)
    root.addHandler(keep)
    try:
        with tally_warnings() as tally:
            logging.getLogger("xce_resize_plugin.test_run_log_root").warning("a %s", "b")
    finally:
        root.removeHandler(keep)
    assert seen == ["a b"]
    assert [s.count for s in tally.summaries()] == [1]


def test_a_record_whose_arguments_do_not_fit_is_still_counted() -> None:
    tally = LogTally()
    record = logging.LogRecord(
        "xce_resize_plugin.x", logging.WARNING, "f", 1, "%d jobs", ("many",), None
    )
    tally.handle(record)
    tally.handle(record)
    (kind,) = tally.summaries()
    assert (kind.count, kind.pattern, kind.first) == (2, "%d jobs", "%d jobs ('many',)")
