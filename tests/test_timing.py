"""The timer's statistics with scripted clocks, and the real blocked runner on TensorFlow."""

import itertools

import numpy as np
import pytest

from keras_models import keras
from tbs.backends.tensorflow.discovery import discover
from tbs.errors import TbsError
from tbs.measure.timing import (HarnessOverhead, Interleaved, Interrupted, Measurement, Timer, TimingConfig,
                               single_calls_timed)


class ScriptedRunner:
    """A fake device: each call of n iterations 'takes' per_call(k) * n + fixed seconds."""

    def __init__(self, per_call, fixed=0.0):
        self.now = 0.0
        self.per_call = per_call
        self.fixed = fixed
        self.count = itertools.count()
        self.calls = []

    def clock(self):
        return self.now

    def __call__(self, n):
        self.calls.append(n)
        self.now += self.fixed + n * self.per_call(next(self.count))


def test_steady_cell_stops_at_min_samples_and_picks_iterations():
    fake = ScriptedRunner(lambda k: 1e-4)
    timer = Timer(TimingConfig(min_samples=10, min_block_seconds=0.01, min_span_seconds=0.0), clock=fake.clock)
    m = timer.measure(fake)
    assert m.status == "ok" and len(m.raw_seconds) == 10
    assert m.iterations * 1e-4 >= 0.01  # one sample lasts at least the block time
    assert m.summary().median_s == pytest.approx(1e-4)


def test_a_whole_models_single_calls_go_on_while_they_are_cheap():
    """Its dispatch is the median of its single calls less its looped call; five read a two-layer model's at
    70-212 us in three pairs of profiles, 25 at 46-71 us. Cheap calls get up to 25, within 0.25 s."""
    config = TimingConfig(min_samples=3, min_block_seconds=0.5, min_span_seconds=0.0)
    for per_call, calls in ((1.5e-4, 25), (0.02, 13), (0.1, 5)):  # 13: the first past 0.25 s
        fake = ScriptedRunner(lambda k, s=per_call: s)
        m = Timer(config, clock=fake.clock).measure(fake, single_calls=5)
        assert m.iterations > 1 and m.single_call_seconds == pytest.approx([per_call] * calls)
        assert single_calls_timed(5, per_call) == min(calls, 25)  # what the ETA expects


def test_samples_must_span_the_minimum_wall_time():
    fake = ScriptedRunner(lambda k: 1e-4)
    timer = Timer(TimingConfig(min_samples=10, min_block_seconds=0.01, min_span_seconds=0.5), clock=fake.clock)
    m = timer.measure(fake)
    assert m.status == "ok" and sum(m.raw_seconds) >= 0.5 - 0.011


def test_jittery_cell_runs_out_of_budget_and_is_noisy():
    rng = np.random.default_rng(0)
    fake = ScriptedRunner(lambda k: 1e-3 * rng.uniform(0.5, 2.0))
    timer = Timer(TimingConfig(min_samples=10, target_ci=0.01, cell_budget_seconds=0.5,
                               min_block_seconds=0.001, ci_floor_seconds=0.0), clock=fake.clock)
    m = timer.measure(fake)
    assert m.status == "noisy" and len(m.raw_seconds) > 10


def test_harness_overhead_is_subtracted_per_call_and_per_iteration():
    m = Measurement(iterations=10, raw_seconds=[0.0105, 0.0107], first_call_seconds=0.0,
                    overhead=HarnessOverhead(per_call_seconds=0.0005, per_iteration_seconds=0.00001))
    assert m.per_call_seconds == pytest.approx([0.00099, 0.00101])


class Machine:
    """One clock shared by several scripted runners; speed can drift with time."""

    def __init__(self, slowdown=lambda now: 1.0):
        self.now = 0.0
        self.slowdown = slowdown

    def clock(self):
        return self.now

    def runner(self, per_call, fixed=0.0):
        def run(n):
            self.now += (fixed + n * per_call) * self.slowdown(self.now)
        return run


def test_harness_cost_is_sampled_alongside_and_subtracted():
    machine = Machine()
    timer = Timer(TimingConfig(min_block_seconds=0.01), clock=machine.clock)
    harness = machine.runner(per_call=2e-6, fixed=4e-4)  # the empty loop: fixed cost + per iteration
    layer = machine.runner(per_call=2e-6 + 5e-5, fixed=4e-4)  # the same harness plus 50 us of work
    sampler = Interleaved(timer, harness)
    sampler.add("layer", layer)
    done = {}
    sampler.run(on_done=done.__setitem__)
    assert sampler.overhead.per_call_seconds == pytest.approx(4e-4)
    assert sampler.overhead.per_iteration_seconds == pytest.approx(2e-6, rel=1e-3)
    assert done["layer"].summary().median_s == pytest.approx(5e-5, rel=1e-3)


def test_rounds_spread_drift_over_every_cell():
    """Throughput halves halfway through: interleaved cells of equal cost still agree."""
    machine = Machine(slowdown=lambda now: 1.0 if int(now / 0.05) % 2 == 0 else 2.0)
    timer = Timer(TimingConfig(min_samples=20, target_ci=0.001, cell_budget_seconds=0.3, min_block_seconds=0.002,
                               ci_floor_seconds=0.0), clock=machine.clock)
    sampler = Interleaved(timer, None)
    for name in "abc":
        sampler.add(name, machine.runner(per_call=1e-4))
    done = {}
    sampler.run(on_done=done.__setitem__)
    medians = [done[k].summary().median_s for k in "abc"]
    assert max(medians) / min(medians) < 1.3
    for k in "abc":  # every cell saw both regimes, so the drift shows in its spread
        per_call = done[k].per_call_seconds
        assert max(per_call) / min(per_call) > 1.8


def test_a_runner_with_its_own_fixed_cost_is_sampled_with_enough_iterations_to_amortise_it():
    """A 5 ms train step with a 5 ms fixed cost per call ran once per 10 ms sample: it read 2x its time."""
    step = ScriptedRunner(lambda k: 5e-3, fixed=5e-3)
    config = TimingConfig(min_samples=10, min_block_seconds=0.01, cell_budget_seconds=3.0, min_span_seconds=0.0)
    timer = Timer(config, clock=step.clock)
    assert timer.calibrate(step)[0] == 1  # the block alone: one call already lasts 10 ms
    n, _ = timer.calibrate(step, amortise_fixed=True)
    assert 5e-3 / (n * 5e-3 + 5e-3) <= 0.03 and n * 5e-3 * 10 <= 3.0  # fixed cost <= 3%; 10 samples fit the budget
    m = Timer(config, clock=step.clock).measure(step, amortise_fixed=True)
    assert m.summary().median_s == pytest.approx(5e-3, rel=0.035)
    tight = Timer(TimingConfig(min_samples=10, min_block_seconds=0.01, cell_budget_seconds=0.5), clock=step.clock)
    assert tight.calibrate(step, amortise_fixed=True)[0] == 9  # capped: 10 samples of 9 steps + 5 ms fill 0.5 s
    free = ScriptedRunner(lambda k: 5e-3)  # no fixed cost: nothing to amortise
    plain = Timer(config, clock=free.clock).calibrate(free)[0]
    assert Timer(config, clock=free.clock).calibrate(free, amortise_fixed=True)[0] == plain


def test_a_fixed_cost_that_hides_the_per_iteration_cost_never_blows_a_sample_past_its_budget():
    """A tiny train step: 1 ms fixed, 20 us per step, single calls 0.3 ms slower (noise). The fit at 1 and 4
    iterations read no cost per iteration, and n went to max_iterations: one sample lasted 2 s, not 0.15 s."""
    def step_time(n):
        return 1e-3 + n * 2e-5 + (3e-4 if n == 1 else 0.0)

    clock = {"now": 0.0}

    def step(n):
        clock["now"] += step_time(n)

    config = TimingConfig(min_samples=10, min_block_seconds=0.001, cell_budget_seconds=1.5, min_span_seconds=0.0)
    n, _ = Timer(config, clock=lambda: clock["now"]).calibrate(step, amortise_fixed=True)
    assert step_time(n) <= config.cell_budget_seconds / config.min_samples  # ten samples fit the cell's budget
    assert 1e-3 / step_time(n) <= 0.05  # and the fixed cost is still amortised


def test_the_whole_train_step_and_only_it_amortises_its_own_fixed_cost(monkeypatch, tmp_path):
    """The profiler asks it for the train step (a fixed cost well above the harness's), not for the layers."""
    import tbs

    asked = {}
    add = Interleaved.add

    def spy(self, key, runner, single_calls=0, amortise_fixed=False):
        asked[(key[0].target, key[1])] = amortise_fixed
        return add(self, key, runner, single_calls, amortise_fixed)

    monkeypatch.setattr(Interleaved, "add", spy)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="d")], name="one")
    timing = TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
    tbs.profile(model, [4], training=True, timing=timing, progress=None, report=False, measure=tbs.MeasureConfig(analysis=False),
                out=tmp_path / "p")
    assert asked.pop(("model", "step")) is True
    assert asked and not any(asked.values())  # every layer phase as before


def test_stop_request_interrupts_between_samples():
    fake = ScriptedRunner(lambda k: 1e-3)
    timer = Timer(TimingConfig(min_block_seconds=0.001), should_stop=lambda: len(fake.calls) > 4, clock=fake.clock)
    with pytest.raises(Interrupted):
        timer.measure(fake)


@pytest.mark.parametrize("values, message", [
    ({"min_samples": 0}, "timing: min_samples=0 must be at least 3 (--min-samples)"),
    ({"target_ci": 0.0}, "timing: target_ci=0.0 must be between 0.001 and 1 (--target-ci)"),
    ({"target_ci": 1.5}, "timing: target_ci=1.5 must be between 0.001 and 1 (--target-ci)"),
    ({"cell_budget_seconds": 0.001}, "timing: cell_budget_seconds=0.001 must be at least 0.01 (--max-cell-seconds)"),
    ({"min_block_seconds": 1e-5},
     "timing: min_block_seconds=1e-05 must be at least 0.0001 (--min-block-ms 0.1 or more)"),
    ({"min_span_seconds": -1.0}, "timing: min_span_seconds=-1.0 must be at least 0 (--min-span-seconds)"),
    ({"confidence": 1.0}, "timing: confidence=1.0 must be strictly between 0 and 1 (a fraction such as 0.95)"),
    ({"confidence": 0}, "timing: confidence=0 must be strictly between 0 and 1 (a fraction such as 0.95)"),
    ({"min_samples": 20, "max_samples": 10},
     "timing: max_samples=10 must be at least 20 (raise max_samples or lower min_samples)"),
    ({"max_iterations": 0}, "timing: max_iterations=0 must be at least 1 (a whole number of calls per sample)"),
    ({"target_ci": float("nan")}, "timing: target_ci=nan is not a number; give a number (--target-ci)"),
    ({"min_samples": "10"}, "timing: min_samples='10' is not a number; give a number (--min-samples)"),
])
def test_config_refuses_what_the_cli_refuses(values, message):
    with pytest.raises(TbsError) as info:
        TimingConfig(**values)
    assert str(info.value) == message


def test_config_accepts_the_cli_bounds():
    edge = TimingConfig(min_samples=3, max_samples=3, target_ci=0.001, cell_budget_seconds=0.01,
                        min_block_seconds=0.0001, min_span_seconds=0.0, max_iterations=1, confidence=0.5)
    assert edge.min_samples == 3 and TimingConfig(target_ci=1.0, min_samples=np.int64(5)).target_ci == 1.0


@pytest.mark.parametrize("xla", [False, True], ids=["graph", "xla"])
def test_blocked_loop_really_runs_every_iteration(xla):
    """A while_loop body is not hoisted or merged: n iterations take n times as long.

    With XLA the call is compiled alone and launched each iteration, so XLA cannot hoist it either.
    """
    device = discover(tpu_timeout_s=0.1).devices[0]
    layer = keras.layers.Dense(512)
    x = device.place(np.random.default_rng(0).normal(size=(512, 512)).astype("float32"))
    layer(x)
    runner = device.compile_blocked(lambda t: layer(t), [x], xla=xla)
    timer = Timer(TimingConfig())
    runner(1)

    def best(n):
        return min(timer.timed(runner, n) for _ in range(5))

    ratio = best(32) / best(4)  # 8 if every iteration runs; about 1 if the call were hoisted
    assert 3.0 < ratio < 16.0, ratio
