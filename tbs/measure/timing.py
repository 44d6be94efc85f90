"""Time one compiled, blocked call adaptively and keep every raw sample.

A sample is one timed ``runner(n)``: n iterations of the call inside one
compiled step, so per-call dispatch is amortised. n is chosen so a sample lasts
at least ``min_block_seconds``. The harness's own cost, measured once per device
on an empty loop (a fixed cost per compiled call plus a small cost per loop
iteration), is subtracted, so layers and the whole model are corrected alike.
Sampling stops when the 95% CI of the median is within +-target of it (after at
least ``min_samples``, spread over at least ``min_span_seconds``), or when the
cell's budget runs out: then it is noisy.

A program can cost more per call than the empty loop (a whole train step reads and
writes every variable and optimizer slot around its loop: 1.5-7 ms here), and a
5-10 ms step sized by ``min_block_seconds`` alone ran once or twice per sample, each
sample carrying that cost. Such a runner is calibrated with ``amortise_fixed``: its own
fixed per-call cost is fitted and n grows until that cost is at most 3% of a sample,
as far as the cell's budget allows its minimum samples.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

import numpy as np

from tbs.errors import TbsError
from tbs.units import is_number
from tbs.measure.stats import Summary, summarize
from tbs.schema import Status

Runner = Callable[[int], None]
FIXED_COST_FRACTION = 0.03  # a runner's own fixed per-call cost, at most this share of a sample (amortise_fixed)
FIT_REPEATS = 2  # calls of each size when fitting that cost (the best is kept)
RESOLVED_SHARE = 0.5  # the fit's extra iterations must add at least this share of one call's time
# A whole model's single calls (its dispatch) go on past the number asked for while they are cheap: up to this
# many times that number, within this many seconds. The median of 5 read a two-layer model's dispatch at 70-212 us
# in three pairs of profiles, the median of 25 at 46-71 us; placement prices every program call at it.
SINGLE_CALLS_UP_TO = 5
SINGLE_CALLS_SECONDS = 0.25


def single_calls_timed(asked: int, call_seconds: float) -> int:
    """How many single calls a whole model gets for ``asked``, at ``call_seconds`` a call (its ETA's estimate)."""
    if asked <= 0:
        return 0
    return int(min(asked * SINGLE_CALLS_UP_TO, max(asked, math.ceil(SINGLE_CALLS_SECONDS / max(call_seconds, 1e-9)))))


@dataclass(frozen=True)
class TimingConfig:
    min_samples: int = 10
    max_samples: int = 1000
    target_ci: float = 0.05
    confidence: float = 0.95
    cell_budget_seconds: float = 1.5
    min_block_seconds: float = 0.01
    max_iterations: int = 100_000
    # Below this CI half-width (seconds per call) a cell is tight whatever its relative width:
    # near-zero layers (identities) cannot be resolved finer than the harness's own jitter.
    ci_floor_seconds: float = 5e-7
    # A cell's samples must span this much wall time: throughput on a shared machine drifts
    # on a scale of seconds, and samples from one moment would give a tight CI around it.
    min_span_seconds: float = 2.0

    def __post_init__(self) -> None:
        """Refuse values the CLI would refuse, so a config built in Python fails at once, not mid-run."""
        _at_least("min_samples", self.min_samples, 3, "--min-samples")
        _at_least("max_samples", self.max_samples, self.min_samples, "raise max_samples or lower min_samples")
        _between("target_ci", self.target_ci, 0.001, 1.0, "--target-ci")
        _between("confidence", self.confidence, 0.0, 1.0, "a fraction such as 0.95", open_ends=True)
        _at_least("cell_budget_seconds", self.cell_budget_seconds, 0.01, "--max-cell-seconds")
        _at_least("min_block_seconds", self.min_block_seconds, 0.0001, "--min-block-ms 0.1 or more")
        _at_least("max_iterations", self.max_iterations, 1, "a whole number of calls per sample")
        _at_least("ci_floor_seconds", self.ci_floor_seconds, 0.0, "seconds per call, 0 for none")
        _at_least("min_span_seconds", self.min_span_seconds, 0.0, "--min-span-seconds")

    @property
    def max_span_seconds(self) -> float:
        """The widest sampling window a cell may take before it is called noisy."""
        return 4.0 * max(self.min_span_seconds, self.cell_budget_seconds)


def _number(name: str, value: object, hint: str) -> float:
    """The value as a float, or a TbsError naming it (a string or None would fail deep in a run)."""
    if not isinstance(value, numbers.Real) or not is_number(value):
        raise TbsError(f"timing: {name}={value!r} is not a number; give a number ({hint})")
    return float(value)


def _at_least(name: str, value: object, low: float, hint: str) -> None:
    if _number(name, value, hint) < low:
        raise TbsError(f"timing: {name}={value!r} must be at least {low:g} ({hint})")


def _between(name: str, value: object, low: float, high: float, hint: str, open_ends: bool = False) -> None:
    number = _number(name, value, hint)
    inside = low < number < high if open_ends else low <= number <= high
    if not inside:
        which = "strictly between" if open_ends else "between"
        raise TbsError(f"timing: {name}={value!r} must be {which} {low:g} and {high:g} ({hint})")


@dataclass(frozen=True)
class HarnessOverhead:
    """What the timing harness itself costs on a device (subtracted from every sample)."""

    per_call_seconds: float = 0.0
    per_iteration_seconds: float = 0.0


@dataclass
class Measurement:
    """Raw samples of one cell: ``raw_seconds[i]`` is the wall time of ``iterations`` calls."""

    iterations: int
    raw_seconds: list[float]
    overhead: HarnessOverhead
    first_call_seconds: float
    status: str = Status.OK.value
    single_call_seconds: list[float] = field(default_factory=list)
    note: str = ""  # why a cell is not ok, where the status alone does not say

    @property
    def per_call_seconds(self) -> list[float]:
        """Each sample as seconds per call, harness cost removed (never below zero)."""
        o = self.overhead
        return [
            max((raw - o.per_call_seconds) / self.iterations - o.per_iteration_seconds, 0.0)
            for raw in self.raw_seconds
        ]

    def summary(self, confidence: float = 0.95) -> Summary:
        return summarize(self.per_call_seconds, confidence)


class Interrupted(Exception):
    """Raised inside a measurement when the user asked to stop (Ctrl-C)."""


@dataclass
class _Cell:
    key: Hashable
    runner: Runner
    iterations: int
    first_call_seconds: float
    single_calls: int
    raw: list[float] = field(default_factory=list)
    sampled_seconds: float = 0.0
    first_sample_at: float | None = None
    last_sample_at: float = 0.0


class Timer:
    """Calibrates compiled runners and times them."""

    def __init__(self, config: TimingConfig, should_stop: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.should_stop = should_stop
        self.clock = clock

    def timed(self, runner: Runner, n: int) -> float:
        start = self.clock()
        runner(n)
        return self.clock() - start

    def calibrate(self, runner: Runner, amortise_fixed: bool = False) -> tuple[int, float]:
        """Warm up (first call traces and compiles) and pick iterations per sample.

        With ``amortise_fixed`` n also grows until the runner's own fixed per-call cost is
        amortised (see the module docstring). Returns (iterations, first_call_seconds
        including one call's work).
        """
        first = self.timed(runner, 1)
        elapsed = self.timed(runner, 1)
        n = 1
        # Grow n until one sample lasts min_block_seconds; each probe is itself warm-up.
        while elapsed < self.config.min_block_seconds and n < self.config.max_iterations:
            if self.should_stop():
                raise Interrupted()
            grow = self.config.min_block_seconds / max(elapsed, 1e-7)
            n = int(min(self.config.max_iterations, max(n * 2, math.ceil(n * grow * 1.2))))
            elapsed = self.timed(runner, n)
        if amortise_fixed:
            n = self.amortised(runner, n, elapsed)
        return n, first

    def amortised(self, runner: Runner, n: int, elapsed: float) -> int:
        """Iterations per sample that make the runner's fixed per-call cost at most FIXED_COST_FRACTION of a sample.

        The cost is fitted from the best of FIT_REPEATS calls at 1 and at m iterations:
        t(k) = fixed + k * per_iteration. m grows until the m - 1 extra iterations take at least
        RESOLVED_SHARE of one call, so the fit is not the difference of two noisy fixed costs (a
        tiny train step's fit read about 0 per iteration, and 100,000 iterations of it made one
        sample last 10 s). Where even a sample's worth of iterations cannot resolve it, n is the
        largest m seen to last less than a sample. n stays where the cell's budget could not hold
        its minimum samples of more iterations (a long step is its own amortisation).
        """
        cfg = self.config
        sample_s = cfg.cell_budget_seconds / cfg.min_samples  # the longest sample that lets the minimum fit
        if elapsed >= sample_s or n >= cfg.max_iterations:
            return n
        one = min(self.timed(runner, 1) for _ in range(FIT_REPEATS))
        fitting, m = n, min(cfg.max_iterations, max(4, 2 * n))  # fitting: the most iterations seen within a sample
        many = min(self.timed(runner, m) for _ in range(FIT_REPEATS))
        while many - one < RESOLVED_SHARE * one and many < sample_s and m < cfg.max_iterations:
            if self.should_stop():
                raise Interrupted()
            fitting, m = m, min(cfg.max_iterations, 4 * m)
            many = min(self.timed(runner, m) for _ in range(FIT_REPEATS))
        if many - one < RESOLVED_SHARE * one:  # unresolved: the most iterations seen to fit in a sample
            return max(n, m if many < sample_s else fitting)
        per_iteration = max((many - one) / (m - 1), 1e-9)
        fixed = max(one - per_iteration, 0.0)
        wanted = math.ceil(fixed * (1.0 - FIXED_COST_FRACTION) / (FIXED_COST_FRACTION * per_iteration))
        most = min(cfg.max_iterations, int((sample_s - fixed) / per_iteration + 1e-9))
        return max(n, min(wanted, most))

    def measure(self, runner: Runner, harness: Runner | None = None, single_calls: int = 0,
                amortise_fixed: bool = False) -> Measurement:
        """Calibrate and sample one runner alone (see Interleaved for many)."""
        sampler = Interleaved(self, harness)
        sampler.add("cell", runner, single_calls, amortise_fixed)
        results: dict[Hashable, Measurement] = {}
        sampler.run(on_done=results.__setitem__)
        return results["cell"]


class Interleaved:
    """Sample many cells in rounds, one sample of each per round.

    On a shared machine throughput drifts on a scale of seconds. Sampling cells
    one after another would give each a tight CI around whatever regime it fell
    in; rounds spread every cell's samples over the same span, so drift widens
    CIs honestly and hits the layers and the whole model alike. The harness's own
    cost (an empty runner at 1 and at ``harness_iterations`` iterations) is sampled
    in every round too, and each cell is corrected with its current estimate.
    """

    def __init__(self, timer: Timer, harness: Runner | None, harness_iterations: int = 500) -> None:
        self.timer = timer
        self.harness = harness
        self.harness_iterations = harness_iterations
        self.harness_single: list[float] = []
        self.harness_block: list[float] = []
        self.cells: list[_Cell] = []

    def add(self, key: Hashable, runner: Runner, single_calls: int = 0, amortise_fixed: bool = False) -> int:
        """Compile, warm up and calibrate a cell now (errors are the caller's to record); its calls per sample."""
        iterations, first = self.timer.calibrate(runner, amortise_fixed)
        self.cells.append(_Cell(key, runner, iterations, first, single_calls))
        return iterations

    @property
    def overhead(self) -> HarnessOverhead:
        if not self.harness_single:
            return HarnessOverhead()
        single, block = float(np.median(self.harness_single)), float(np.median(self.harness_block))
        per_iteration = max((block - single) / (self.harness_iterations - 1), 0.0)
        return HarnessOverhead(per_call_seconds=max(single - per_iteration, 0.0), per_iteration_seconds=per_iteration)

    def _sample_harness(self) -> None:
        if self.harness is not None:
            self.harness_single.append(self.timer.timed(self.harness, 1))
            self.harness_block.append(self.timer.timed(self.harness, self.harness_iterations))

    def _finish(self, cell: _Cell, status: str, note: str = "") -> Measurement:
        m = Measurement(iterations=cell.iterations, raw_seconds=cell.raw, overhead=self.overhead,
                        first_call_seconds=0.0, status=status, note=note)
        if cell.iterations == 1:  # every sample already was one call (runner(1)): timing more would repeat them
            m.single_call_seconds = list(cell.raw) if cell.single_calls else []
        elif not note:
            m.single_call_seconds = self._single_calls(cell)
        steady = m.summary().median_s + m.overhead.per_call_seconds + m.overhead.per_iteration_seconds
        m.first_call_seconds = max(cell.first_call_seconds - steady, 0.0)
        return m

    def _single_calls(self, cell: _Cell) -> list[float]:
        """The cell's single calls: as many as asked, then more while they are cheap (``single_calls_timed``)."""
        seconds: list[float] = []
        while len(seconds) < cell.single_calls or (len(seconds) < cell.single_calls * SINGLE_CALLS_UP_TO
                                                   and sum(seconds) < SINGLE_CALLS_SECONDS):
            seconds.append(self.timer.timed(cell.runner, 1))
        return seconds

    def _verdict(self, cell: _Cell) -> str | None:
        cfg = self.timer.config
        if len(cell.raw) < cfg.min_samples:
            return None
        m = Measurement(cell.iterations, cell.raw, self.overhead, 0.0)
        summary = m.summary(cfg.confidence)
        half_width = (summary.ci_high_s - summary.ci_low_s) / 2.0
        tight = summary.ci_half_width_fraction <= cfg.target_ci or half_width <= cfg.ci_floor_seconds
        span = cell.last_sample_at - (cell.first_sample_at or cell.last_sample_at)
        if tight and span >= cfg.min_span_seconds:
            return Status.OK.value
        # Out of budget: its own sampling time, or (in rounds over many cells, where a cheap cell
        # costs the whole round) the wall time its samples already span -- but only once it has
        # three times the minimum samples: ten samples give a CI of the median from the 2nd to the
        # 9th value, which drift alone makes wide.
        spread_out = span > cfg.max_span_seconds and len(cell.raw) >= 3 * cfg.min_samples
        if cell.sampled_seconds > cfg.cell_budget_seconds or spread_out or len(cell.raw) >= cfg.max_samples:
            return Status.NOISY.value
        return None

    def run(self, on_done: Callable[[Hashable, Measurement], None],
            on_error: Callable[[Hashable, BaseException], None] | None = None,
            on_round: Callable[[int], None] | None = None) -> None:
        """Sample in rounds until every cell is tight or out of budget; report each as it finishes."""
        if self.harness is not None:
            for _ in range(3):
                self.harness(1)
            for _ in range(3):
                self._sample_harness()
        active = list(self.cells)
        try:
            self._rounds(active, on_done, on_error, on_round)
        except Interrupted:
            # Keep what was sampled: cells with their minimum samples are saved, marked noisy.
            for cell in active:
                if len(cell.raw) >= self.timer.config.min_samples:
                    on_done(cell.key, self._finish(cell, Status.NOISY.value, "interrupted before its CI was tight"))
            raise

    def _rounds(self, active: list[_Cell], on_done: Callable[[Hashable, Measurement], None],
                on_error: Callable[[Hashable, BaseException], None] | None,
                on_round: Callable[[int], None] | None) -> None:
        while active:
            self._sample_harness()
            for cell in list(active):
                if self.timer.should_stop():
                    raise Interrupted()
                try:
                    started = self.timer.clock()
                    seconds = self.timer.timed(cell.runner, cell.iterations)
                except Exception as exc:
                    if on_error is None:
                        raise
                    active.remove(cell)
                    on_error(cell.key, exc)
                    continue
                cell.raw.append(seconds)
                cell.sampled_seconds += seconds
                cell.first_sample_at = started if cell.first_sample_at is None else cell.first_sample_at
                cell.last_sample_at = started + seconds
            for cell in list(active):
                verdict = self._verdict(cell)
                if verdict is not None:
                    active.remove(cell)
                    on_done(cell.key, self._finish(cell, verdict))
            if on_round is not None:
                on_round(len(active))
