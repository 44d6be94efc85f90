import numpy as np
import pytest

from tbs.measure.stats import median_ci_ranks, summarize


@pytest.mark.parametrize("n, ranks", [(10, (1, 8)), (20, (5, 14)), (100, (39, 60))])
def test_median_ci_ranks_match_binomial_tables(n, ranks):
    # Published 95% order-statistic CIs for the median (1-based 2..9, 6..15, 40..61).
    assert median_ci_ranks(n) == ranks


def test_median_ci_covers_true_median_about_95_percent():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(2000):
        s = summarize(rng.lognormal(0.0, 0.5, size=15))
        hits += s.ci_low_s <= 1.0 <= s.ci_high_s  # median of lognormal(0, .) is 1
    assert 0.93 <= hits / 2000 <= 0.995


def test_summarize_quartiles_and_width():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert s.median_s == 5.5 and s.p25_s == pytest.approx(3.25) and s.p75_s == pytest.approx(7.75)
    assert (s.ci_low_s, s.ci_high_s) == (2.0, 9.0)
    assert s.ci_half_width_fraction == pytest.approx(3.5 / 5.5)
