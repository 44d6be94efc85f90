"""How long the remaining cells will take, so the progress bar's ETA is honest.

Before anything is timed, a cell's cost is guessed from the eager capture pass
(scaled linearly to larger batches); each finished group of cells (one batch on
one device, sampled together) shows how far off those guesses are, and the
remaining guesses are corrected by that factor. Once a layer has been measured
at one batch size, its cells at larger batches are re-estimated from that
measurement: the samples it needed and its compiled time scaled by the batch ratio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from tbs.measure.timing import TimingConfig, single_calls_timed
from tbs.schema import MODEL_LAYER, CellKey

TRACE_ESTIMATE_S = 0.15  # tracing + Grappler for one small tf.function on this class of machine
CALIBRATION_BLOCKS = 3  # first call, single call, iteration probes
HARNESS_SHARE = 1.1  # each round also samples the empty harness


@dataclass(frozen=True)
class Observation:
    batch_size: int
    median_s: float
    samples: int


class WorkEstimate:
    """Estimated seconds per unmeasured cell; cells are keys (target, layer, device, batch, mode)."""

    def __init__(self, config: TimingConfig, single_calls: int = 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.single_calls = single_calls
        self.clock = clock
        self.cells: dict[tuple, float] = {}
        self.guessed: set[tuple] = set()
        self.observed: dict[tuple, Observation] = {}
        self.group: set[tuple] = set()
        self.group_started = clock()
        self.group_guess_s = 0.0
        self.group_estimate_s = 0.0
        self.guess_actual_s = 0.0
        self.guess_estimate_s = 0.0

    @property
    def guess_factor(self) -> float:
        """How far off the eager guesses have been so far (actual / guessed), shrunk towards 1."""
        prior_s = 2.0
        ratio = (self.guess_actual_s + prior_s) / (self.guess_estimate_s + prior_s)
        return min(max(ratio, 0.05), 20.0)

    def _scaled(self, key: tuple) -> float:
        return self.cells[key] * (self.guess_factor if key in self.guessed else 1.0)

    @property
    def remaining_seconds(self) -> float:
        later = sum(self._scaled(k) for k in self.cells if k not in self.group)
        current = self.group_estimate_s * (self.guess_factor if self.group_guess_s else 1.0)
        spent = self.clock() - self.group_started
        return later + max(current - spent, 0.05 * current)

    def cell_seconds(self, call_seconds: float, samples: int | None = None, target: str = "layer") -> float:
        blocks = (samples or self.config.min_samples) * HARNESS_SHARE + CALIBRATION_BLOCKS
        # A model's single calls are timed apart only where a sample holds several calls.
        several = call_seconds < self.config.min_block_seconds
        single = single_calls_timed(self.single_calls, call_seconds)
        extra = single * call_seconds if target == "model" and several else 0.0
        return TRACE_ESTIMATE_S + blocks * max(self.config.min_block_seconds, call_seconds) + extra

    def seed(self, calls: Sequence[Any], first_batch: int, batch_sizes: Iterable[int], devices: Iterable[str],
             mode: str, phases: int, is_done: Callable[[tuple], bool]) -> None:
        """Guess every unmeasured cell from the eager capture's seconds per call at ``first_batch``.

        ``phases`` programs per cell (a training cell times forward, backward and update).
        """
        eager_s = sum(c.eager_seconds for c in calls)
        for batch in batch_sizes:
            scale = batch / first_batch * phases
            for device in devices:
                for call in calls:
                    key = CellKey.of("layer", call.name, device, batch, mode)
                    if not is_done(key):
                        self.guess(key, call.eager_seconds * scale)
                key = CellKey.of("model", MODEL_LAYER, device, batch, mode)
                if not is_done(key):
                    self.guess(key, eager_s * scale)

    def guess(self, key: tuple, call_seconds: float) -> None:
        """Estimate a cell from a rough per-call time (the eager capture pass)."""
        self.cells[key] = self.cell_seconds(call_seconds, target=key[0])
        self.guessed.add(key)

    def begin_group(self, keys: Iterable[tuple]) -> None:
        """These cells are about to be measured together."""
        self.group = {k for k in keys if k in self.cells}
        self.group_started = self.clock()
        self.group_estimate_s = sum(self.cells[k] for k in self.group)
        self.group_guess_s = sum(self.cells[k] for k in self.group if k in self.guessed)

    def end_group(self) -> None:
        """The group is done: learn how far off its guesses were."""
        elapsed = self.clock() - self.group_started
        if self.group_guess_s > 0 and self.group_estimate_s > 0:
            self.guess_actual_s += elapsed * self.group_guess_s / self.group_estimate_s
            self.guess_estimate_s += self.group_guess_s
        for key in self.group:
            self.cells.pop(key, None)
            self.guessed.discard(key)
        self.group, self.group_estimate_s, self.group_guess_s = set(), 0.0, 0.0

    def finished(self, key: tuple, median_s: float | None = None, samples: int | None = None) -> None:
        """A cell is measured (or failed); remember its time for its larger batches."""
        if key not in self.group:
            self.cells.pop(key, None)
            self.guessed.discard(key)
        if median_s is not None and samples:
            target, layer, device, batch, mode = key
            self.observed[(target, layer, device, mode)] = Observation(int(batch), float(median_s), int(samples))

    def revise(self) -> None:
        """Re-estimate every remaining cell that has a measurement at a smaller batch size."""
        for key in list(self.cells):
            target, layer, device, batch, mode = key
            seen = self.observed.get((target, layer, device, mode))
            if seen is None or seen.batch_size > batch:
                continue
            call = seen.median_s * batch / seen.batch_size
            self.cells[key] = self.cell_seconds(call, seen.samples, target)
            self.guessed.discard(key)
