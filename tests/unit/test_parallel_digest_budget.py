"""The older segment of a split run digests its state only within a budget, as its
successor does (simulation/parallel.py, ``_Stepper._met``): where the signatures of the
two agree and the digests never do, a state of megabytes (65,536 hosts) would otherwise
cost it seconds a probe. Over the budget a probe is passed over, never called a meeting;
within it, an equal digest is a meeting."""

from __future__ import annotations

import time
from typing import Any

import pytest

from xce_resize_plugin.simulation import parallel
from xce_resize_plugin.simulation.parallel import DIGEST_FREE, DIGEST_SHARE, _Stepper
from xce_resize_plugin.simulation.simulate import Workload


class _Conn:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, msg: tuple[Any, ...]) -> None:
        self.sent.append(msg)


def _stepper(monkeypatch: pytest.MonkeyPatch, digests: list[int]) -> tuple[_Stepper, _Conn]:
    """A stepper whose successor sent, for probe 7, the signature and digest its own
    state has (digests made are counted in ``digests``)."""
    monkeypatch.setattr(parallel, "signature", lambda ctl: ("sig",))

    def digest(ctl: object, driver: object) -> bytes:
        digests.append(1)
        return b"same"

    monkeypatch.setattr(parallel, "digest", digest)
    conn = _Conn()
    workload = Workload.__new__(Workload)
    stepper = _Stepper(conn, workload, "elastic", 0, 0, [])  # type: ignore[arg-type]
    stepper.theirs[7] = (("sig",), b"same")
    return stepper, conn


class _Parts:
    driver = None


def test_within_its_budget_an_equal_digest_is_a_meeting(monkeypatch: pytest.MonkeyPatch) -> None:
    digests: list[int] = []
    stepper, conn = _stepper(monkeypatch, digests)
    assert stepper._met(None, _Parts(), 7)  # type: ignore[arg-type]
    assert digests == [1] and conn.sent == [("met", "elastic", 0, 7)]


def test_over_its_budget_a_probe_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    digests: list[int] = []
    stepper, conn = _stepper(monkeypatch, digests)
    # Ten seconds into the segment, more than its share spent on digests already.
    stepper.began = time.perf_counter() - 10.0
    stepper.digesting = max(DIGEST_SHARE * 10.0, DIGEST_FREE) + 1.0
    assert not stepper._met(None, _Parts(), 7)  # type: ignore[arg-type]
    assert digests == [] and conn.sent == []
