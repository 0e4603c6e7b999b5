"""Two special functions the simulation needs, without a numerical library.

- :func:`gamma_cdf`: the gamma distribution's CDF (the regularized lower incomplete
  gamma function), for the daily cycle of the Lublin-Feitelson arrivals (:mod:`.lublin`);
- :func:`student_t_quantile`: a quantile of Student's t distribution, for the
  confidence intervals of a sweep (:mod:`.sweep_report`).

Both are the textbook methods (a power series for the incomplete gamma function, a
continued fraction for the incomplete beta function, evaluated with the modified Lentz
algorithm, and bisection for the quantile), accurate to about 1e-12, far beyond what
either use needs. Pure functions: no state, no randomness.
"""

from __future__ import annotations

import math

__all__ = ["gamma_cdf", "incomplete_beta", "student_t_cdf", "student_t_quantile"]

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 10_000


def gamma_cdf(x: float, shape: float, scale: float) -> float:
    """P(X <= x) for X ~ Gamma(``shape``, ``scale``) (mean = shape x scale)."""
    if shape <= 0 or scale <= 0:
        raise ValueError(f"gamma needs shape > 0 and scale > 0, not {shape!r}, {scale!r}")
    if x <= 0:
        return 0.0
    z = x / scale
    if z > shape + 40.0 * math.sqrt(shape) + 40.0:
        return 1.0  # the series would need thousands of terms for a value of 1.0
    # P(a, z) = z^a e^-z / Gamma(a+1) * sum_n z^n / ((a+1)...(a+n))
    term = 1.0
    total = 1.0
    a = shape
    for _ in range(_MAX_TERMS):
        a += 1.0
        term *= z / a
        total += term
        if term < total * _EPS:
            break
    log_front = shape * math.log(z) - z - math.lgamma(shape + 1.0)
    return min(1.0, math.exp(log_front) * total)


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta needs 0 <= x <= 1, not {x!r}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    # The fraction converges fast for x below the mean; use the symmetry above it.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(x, a, b) / a
    return 1.0 - front * _beta_fraction(1.0 - x, b, a) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"Student's t needs df > 0, not {df!r}")
    tail = 0.5 * incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = ``p`` (0 < p < 1), by bisection on :func:`student_t_cdf`."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, not {p!r}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return (lo + hi) / 2.0
