"""The special functions behind the synthetic arrivals and the sweeps' intervals."""

from __future__ import annotations

import math

import pytest

from xce_resize_plugin.simulation.special import gamma_cdf, student_t_cdf, student_t_quantile


@pytest.mark.parametrize(
    ("df", "t"),
    # Two-sided 95 % critical values, from printed tables of Student's t.
    [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452), (1000, 1.9623)],
)
def test_t_quantiles_match_the_tables(df: int, t: float) -> None:
    assert student_t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
    assert student_t_quantile(0.025, df) == pytest.approx(-t, abs=1e-4)
    assert student_t_cdf(t, df) == pytest.approx(0.975, abs=1e-5)


def test_gamma_cdf_against_closed_forms() -> None:
    # shape 1 is the exponential distribution.
    for x in (0.1, 1.0, 5.0):
        assert gamma_cdf(x, 1.0, 2.0) == pytest.approx(1 - math.exp(-x / 2.0), rel=1e-12)
    # shape 2: 1 - e^-x (1 + x).
    assert gamma_cdf(3.0, 2.0, 1.0) == pytest.approx(1 - math.exp(-3.0) * 4.0, rel=1e-12)
    # chi-square with 5 degrees of freedom at 6 (tables: 0.6938).
    assert gamma_cdf(6.0, 2.5, 2.0) == pytest.approx(0.69378, abs=1e-5)
    assert gamma_cdf(0.0, 3.0, 1.0) == 0.0 and gamma_cdf(1e6, 3.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        gamma_cdf(1.0, 0.0, 1.0)
