"""Whether a cell changed beyond noise: a bootstrap of the ratio of medians, corrected for many cells.

Why this statistic. tbs summarises every cell by its median (timing samples are skewed and
have outliers), so the change a user reads is the ratio of the two medians, and that is what
is tested. Its uncertainty comes from resampling each side's raw per-call samples
(``scipy.stats.bootstrap``, independent samples, 1,000 resamples, a fixed seed so that a diff is
reproducible): the bootstrap's standard error of log(new median / base median), against Student's t
with as many degrees of freedom as the fewer samples allow, gives the confidence interval of the
change and a two-sided p-value from one and the same number, so a cell called slower always has its
whole interval above zero. A rank test (Mann-Whitney U) would
test another thing than the median a user sees, and its interval of a ratio needs a second method.

Why a correction. A profile has hundreds of cells (layers x devices x batch sizes); at 95% each,
pure noise would call about one in twenty of them slower or faster. The p-values of all the
cells compared are adjusted together (Benjamini-Hochberg, ``scipy.stats.false_discovery_control``):
when nothing changed, the chance that any cell is called changed stays at 1 - confidence, and a
real change still stands out. A cell's ``confidence`` is 1 - its adjusted p-value.

A training row is the sum of its phases (forward, backward, update): each phase's samples are
resampled on their own and the sum of their medians is what the bootstrap varies; its relative
spread is the row's.
"""

from __future__ import annotations

import math
import warnings
from typing import Mapping

import numpy as np
from scipy import stats

RESAMPLES = 1000
SEED = 0
MIN_SAMPLES = 3  # tbs profile's least --min-samples

# A cell's verdict. From the samples: SLOWER, FASTER, NO_CHANGE; otherwise why there is none.
SLOWER, FASTER, NO_CHANGE = "slower", "faster", "no change"
BELOW_RESOLUTION = "below resolution"  # a median of 0: the harness's own cost left nothing to compare
NO_SAMPLES = "no samples"  # one side kept no raw samples for the cell
TOO_FEW = "too few samples"
FAILED = "failed"  # measured in BASE, failed (oom, error, unsupported) in NEW: gates like a regression
FIXED = "now measured"  # failed in BASE, measured in NEW
NOT_MEASURED = "not measured"  # failed on both sides
ADDED, REMOVED = "added", "removed"  # a layer only NEW (BASE) has
ONLY_BASE, ONLY_NEW = "only in base", "only in new"  # a cell one side lacks (an interrupted profile)
PREDICTED = "predicted"  # predicted on both sides: the change of two predictions, no verdict

# Phases that are not part of a cell's time: the whole model's calls back to back (throughput).
NOT_SUMMED = ("overlapped",)
CONTAINS_FORWARD = "forward+backward"  # TensorFlow's tape: its samples hold the forward too


def row_phases(phases: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The phases whose medians add up to the cell's time (a forward inside forward+backward counts once)."""
    kept = {p: v for p, v in phases.items() if p not in NOT_SUMMED}
    if CONTAINS_FORWARD in kept:
        kept.pop("forward", None)
    return kept


def log_ratio_error(base: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray]) -> float:
    """The bootstrap standard error of log(Σ new phase medians / Σ base phase medians); inf where a
    resample's median is 0 (the cell is at the harness's resolution and no ratio is stable)."""
    arrays = [np.asarray(v, dtype=float) for v in (*base.values(), *new.values())]
    if all(np.ptp(a) == 0 for a in arrays):
        return 0.0  # constant samples (scripted devices): the bootstrap would say 0 after 1,000 tries
    k = len(base)

    def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        base_s = sum(np.median(s, axis=axis) for s in samples[:k])
        new_s = sum(np.median(s, axis=axis) for s in samples[k:])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(new_s) - np.log(base_s)

    with np.errstate(all="ignore"), warnings.catch_warnings():  # inf - inf where a resampled median is 0
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.bootstrap(tuple(arrays), statistic, vectorized=True, paired=False, n_resamples=RESAMPLES,
                                 method="percentile", rng=np.random.default_rng(SEED))
        error = float(result.standard_error)
    return error if math.isfinite(error) else math.inf


def change_interval(base_s: float, new_s: float, error: float, confidence: float,
                    fewest: int) -> tuple[float, float, float, float]:
    """(change, ci_low, ci_high, p_value): the change new/base - 1, its interval, the two-sided p-value.

    The reference is Student's t with ``fewest`` - 1 degrees of freedom (the fewest samples of any phase
    on either side), not the normal: the bootstrap's standard error of a median of 10 samples rests on
    its few middle order statistics and is itself uncertain, and with the normal, pure noise over 300
    cells of 10-15 samples was called changed after the correction in 6 families of 20 (t: none).
    """
    estimate = math.log(new_s / base_s)
    change = new_s / base_s - 1.0
    if error == 0.0:
        return change, change, change, 1.0 if estimate == 0.0 else 0.0
    if not math.isfinite(error):
        return change, math.nan, math.nan, 1.0
    df = max(fewest - 1, 1)
    t = float(stats.t.ppf(0.5 + confidence / 2.0, df))
    low, high = math.expm1(estimate - t * error), math.expm1(estimate + t * error)
    return change, low, high, float(2.0 * stats.t.sf(abs(estimate) / error, df))


def adjusted(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values of every cell compared together."""
    if not p_values:
        return []
    return [float(q) for q in stats.false_discovery_control(np.asarray(p_values, dtype=float), method="bh")]


def verdict(change: float, q_value: float, confidence: float) -> str:
    """slower / faster when the adjusted p-value clears 1 - confidence, else no change."""
    if q_value <= 1.0 - confidence and change != 0.0:
        return SLOWER if change > 0 else FASTER
    return NO_CHANGE
