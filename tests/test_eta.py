import pytest

from tbs.measure.eta import CALIBRATION_BLOCKS, HARNESS_SHARE, TRACE_ESTIMATE_S, WorkEstimate
from tbs.measure.timing import TimingConfig


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def key(layer, batch, target="layer"):
    return (target, layer, "cpu:0", batch, "inference")


def test_measured_layer_re_estimates_its_larger_batches():
    cfg = TimingConfig(min_samples=10, min_block_seconds=0.01)
    eta = WorkEstimate(cfg, clock=Clock())
    eta.guess(key("conv", 32), 0.05)
    eta.guess(key("conv", 512), 0.05 * 16)
    eta.finished(key("conv", 32), median_s=0.02, samples=12)
    eta.revise()
    # measured 20 ms at batch 32 -> 320 ms at 512, for 12 samples (+ harness share) + calibration
    expected = TRACE_ESTIMATE_S + (12 * HARNESS_SHARE + CALIBRATION_BLOCKS) * 0.32
    assert eta.cells[key("conv", 512)] == pytest.approx(expected)


def test_group_time_counts_down_and_corrects_later_guesses():
    clock = Clock()
    eta = WorkEstimate(TimingConfig(min_samples=10, min_block_seconds=0.01), clock=clock)
    first = [key(f"l{i}", 8) for i in range(4)]
    later = [key(f"l{i}", 16) for i in range(4)]
    for k in first + later:
        eta.guess(k, 1.0)
    per_cell = eta.cells[first[0]]
    eta.begin_group(first)
    assert eta.remaining_seconds == pytest.approx(8 * per_cell)
    clock.now = per_cell  # a quarter of the group's guess has passed
    assert eta.remaining_seconds == pytest.approx(7 * per_cell)
    for k in first:
        eta.finished(k)
    eta.end_group()  # the group took a quarter of its guess: later guesses shrink towards that
    assert per_cell < eta.remaining_seconds < 0.5 * 4 * per_cell
