"""Summary statistics from raw timing samples.

The median and its confidence interval are distribution-free (order statistics
with binomial ranks), because timing samples are skewed and have outliers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import stats as _scipy_stats


@dataclass(frozen=True)
class Summary:
    n: int
    median_s: float
    p25_s: float
    p75_s: float
    ci_low_s: float
    ci_high_s: float

    @property
    def ci_half_width_fraction(self) -> float:
        """Half the CI width relative to the median (0.05 means +-5%)."""
        if self.median_s <= 0:
            return float("inf") if self.ci_high_s > self.ci_low_s else 0.0
        return (self.ci_high_s - self.ci_low_s) / 2.0 / self.median_s


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the order statistics bounding the median's CI.

    Uses Binomial(n, 1/2): P(X(lo) <= median <= X(hi)) >= confidence. For very
    small n the full range is the best available bound.
    """
    if n <= 0:
        raise ValueError("need at least one sample")
    alpha = 1.0 - confidence
    lo = int(_scipy_stats.binom.ppf(alpha / 2.0, n, 0.5))
    hi = int(_scipy_stats.binom.isf(alpha / 2.0, n, 0.5))
    # binom ranks are 1-based positions counted from the bottom/top
    lo_rank = max(lo - 1, 0)
    hi_rank = min(hi, n - 1)
    return lo_rank, hi_rank


def summarize(samples_s: Sequence[float], confidence: float = 0.95) -> Summary:
    """Median, IQR and the median's CI of a non-empty list of seconds."""
    values = np.sort(np.asarray(samples_s, dtype=float))
    n = len(values)
    lo, hi = median_ci_ranks(n, confidence)
    return Summary(
        n=n,
        median_s=float(np.median(values)),
        p25_s=float(np.percentile(values, 25)),
        p75_s=float(np.percentile(values, 75)),
        ci_low_s=float(values[lo]),
        ci_high_s=float(values[hi]),
    )
