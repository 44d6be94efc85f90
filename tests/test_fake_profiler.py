"""The real Profiler on scripted fake devices (tbs.testing): no TensorFlow, JAX or Keras, exact times."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tbs.measure.eta import TRACE_ESTIMATE_S
from tbs.schema import MODEL_LAYER, CellKey
from tbs.testing import HARNESS, FakeClock, FakeDevice, FakeLayer, FakeModel, RecordingProgress, chain, fake_profile

LAYERS = ("dense", "relu", "dense_1")
BATCHES = (8, 64)
# Seconds per sample: a call at batch b takes b times these (so the ETA's batch scaling holds).
PER_SAMPLE = {"cpu:0": {"dense": 2e-4, "relu": 1e-5, "dense_1": 5e-5},
              "gpu:0": {"dense": 1e-5, "relu": 1e-6, "dense_1": 2e-5, MODEL_LAYER: 4e-5}}
HARNESS_CALL_S, HARNESS_ITERATION_S, COPY_S = 3e-5, 2e-6, 1e-4


def expected_seconds(device: str, target: str, batch: int) -> float:
    script = PER_SAMPLE[device]
    if target == MODEL_LAYER and MODEL_LAYER not in script:
        return sum(script[name] for name in LAYERS) * batch
    return script[target] * batch


def make_devices(clock: FakeClock, **gpu_faults: dict) -> list[FakeDevice]:
    def device(kind: str, **faults: dict) -> FakeDevice:
        script = {k: (lambda b, s=s: s * b) for k, s in PER_SAMPLE[f"{kind}:0"].items()}
        return FakeDevice(kind, 0, clock, script, **faults, harness_call_seconds=HARNESS_CALL_S,
                          harness_iteration_seconds=HARNESS_ITERATION_S, compile_seconds=TRACE_ESTIMATE_S,
                          copy_seconds=COPY_S)

    return [device("cpu"), device("gpu", **gpu_faults)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One complete fake profile (batch sizes given out of order), with its clock and progress."""
    clock = FakeClock()
    progress = RecordingProgress(clock)
    profile = fake_profile(tmp_path_factory.mktemp("fake"), chain(*LAYERS), make_devices(clock),
                           batch_sizes=BATCHES[::-1], progress=progress)
    return profile, clock, progress


def test_one_row_per_cell_all_ok(run):
    profile, _, _ = run
    assert profile.complete
    summary, model = profile.summary, profile.model
    assert sorted(zip(summary.layer, summary.device, summary.batch_size)) == sorted(
        (layer, device, batch) for layer in LAYERS for device in PER_SAMPLE for batch in BATCHES)
    assert sorted(zip(model.device, model.batch_size)) == sorted((d, b) for d in PER_SAMPLE for b in BATCHES)
    assert set(summary.status) == {"ok"} and set(model.status) == {"ok"}


def test_medians_are_the_scripted_seconds_with_the_harness_subtracted(run):
    profile, _, _ = run
    for row in profile.summary.itertuples():
        assert row.median_s == pytest.approx(expected_seconds(row.device, row.layer, row.batch_size), rel=1e-6)
    for row in profile.model.itertuples():
        assert row.median_s == pytest.approx(expected_seconds(row.device, MODEL_LAYER, row.batch_size), rel=1e-6)
        # single calls pay the harness's fixed cost once; the input copy is one scripted place()
        assert row.dispatch_overhead_s == pytest.approx(HARNESS_CALL_S + HARNESS_ITERATION_S, rel=1e-6)
        assert row.input_copy_s == pytest.approx(COPY_S, rel=1e-6)
    samples = profile.samples
    assert samples.harness_call_s.to_numpy() == pytest.approx(HARNESS_CALL_S, rel=1e-6)
    assert samples.harness_iteration_s.to_numpy() == pytest.approx(HARNESS_ITERATION_S, rel=1e-6)
    # what was subtracted is really there: a raw sample is the harness plus n calls
    for s in samples.itertuples():
        work = expected_seconds(s.device, s.layer, s.batch_size)
        raw = HARNESS_CALL_S + s.iterations * (HARNESS_ITERATION_S + work)
        assert s.raw_seconds == pytest.approx(raw, rel=1e-6)
    assert (profile.summary.first_call_s.to_numpy() == pytest.approx(TRACE_ESTIMATE_S, rel=1e-6))


def test_cells_are_measured_batch_ascending_then_devices_in_order(run):
    _, clock, _ = run
    groups: list[tuple[int, str]] = []
    for event in clock.compiles():
        if event.target != HARNESS and (event.batch, event.device) not in groups:
            groups.append((event.batch, event.device))
    assert groups == [(8, "cpu:0"), (8, "gpu:0"), (64, "cpu:0"), (64, "gpu:0")]
    # within a group: the layers in model order, then the whole model
    assert [e.target for e in clock.compiles(device="gpu:0", batch=64)] == [*LAYERS, MODEL_LAYER]


def sampled_targets(clock: FakeClock, profile, device: str, batch: int) -> list[str]:
    """Targets of a group's sampling runs in the order they ran (calibration and single calls left out)."""
    events = clock.events
    last_compile = max(i for i, e in enumerate(events) if e.iterations == 0 and (e.device, e.batch) == (device, batch))
    start = next(i for i, e in enumerate(events) if i > last_compile and e.device == device
                 and e.target == HARNESS and e.iterations > 1)
    counts = {row.layer: row.n for row in profile.summary.itertuples() if (row.device, row.batch_size) == (device, batch)}
    counts[MODEL_LAYER] = int(profile.model[(profile.model.device == device) & (profile.model.batch_size == batch)].n.iloc[0])
    taken = {target: 0 for target in counts}
    order = []
    for e in events[start:]:
        if (e.device, e.batch) == (device, batch) and e.target in counts and taken[e.target] < counts[e.target]:
            taken[e.target] += 1
            order.append(e.target)
    return order


def test_cells_of_a_group_are_sampled_in_rounds(run):
    profile, clock, _ = run
    for device in PER_SAMPLE:
        for batch in BATCHES:
            order = sampled_targets(clock, profile, device, batch)
            cells = len(LAYERS) + 1
            rounds = len(order) // cells
            assert rounds >= 10 and len(order) == rounds * cells
            assert order == order[:cells] * rounds  # A B C M A B C M ..., not A A A ... B B B


def test_eta_counts_down_to_about_zero(run):
    """Compiles cost what the estimate assumes (TRACE_ESTIMATE_S) and calls scale with the batch, as it assumes."""
    _, _, progress = run
    total = progress.finished_at - progress.started_at
    estimates = [remaining for _, remaining in progress.estimates]
    first, last = estimates[0], estimates[-1]
    assert total / 1.5 < first < total * 1.5
    assert last < 0.05 * first
    assert all(later <= earlier + 0.02 * first for earlier, later in zip(estimates, estimates[1:]))


def test_failing_layers_are_recorded_and_the_rest_measured(tmp_path):
    clock = FakeClock()
    devices = make_devices(clock, failures={"relu": RuntimeError("no kernel for Relu")},
                           run_failures={"dense_1": (4, MemoryError("out of memory in round 2"))})
    profile = fake_profile(tmp_path, chain(*LAYERS), devices, batch_sizes=BATCHES)
    assert profile.complete
    status = {(r.layer, r.device, r.batch_size): (r.status, r.reason) for r in profile.summary.itertuples()}
    for batch in BATCHES:
        assert status[("relu", "gpu:0", batch)] == ("error", "RuntimeError: no kernel for Relu")
        assert status[("dense_1", "gpu:0", batch)] == ("oom", "MemoryError: out of memory in round 2")
        assert status[("dense", "gpu:0", batch)][0] == "ok"
        assert all(status[(layer, "cpu:0", batch)][0] == "ok" for layer in LAYERS)
    failed = profile.samples[(profile.samples.device == "gpu:0") & profile.samples.layer.isin(["relu", "dense_1"])]
    assert failed.empty
    assert set(profile.model.status) == {"ok"}
    # dense_1's runner failed while sampling, after calibrating: the on_error path, not a compile error
    assert len(clock.runs(device="gpu:0", target="dense_1", batch=8)) == 5


def test_capture_out_of_memory_fails_that_group_only(tmp_path):
    clock = FakeClock()
    devices = make_devices(clock, capture_failures={8: RuntimeError("RESOURCE_EXHAUSTED: OOM when allocating")})
    profile = fake_profile(tmp_path, chain(*LAYERS), devices, batch_sizes=BATCHES)
    assert profile.complete
    bad = (profile.summary.device == "gpu:0") & (profile.summary.batch_size == 8)
    assert set(profile.summary[bad].status) == {"oom"} and bad.sum() == len(LAYERS)
    assert set(profile.summary[bad].reason) == {"RuntimeError: RESOURCE_EXHAUSTED: OOM when allocating"}
    assert set(profile.summary[~bad].status) == {"ok"}  # later groups, gpu:0 @ 64 included, go on
    model = profile.model.set_index(["device", "batch_size"]).status
    assert model[("gpu:0", 8)] == "oom" and model[("gpu:0", 64)] == "ok" and model[("cpu:0", 8)] == "ok"
    assert clock.compiles(device="gpu:0", batch=8) == []


def test_resume_measures_only_the_missing_cells(tmp_path):
    first_clock = FakeClock()
    # Stop once the first group's last cell (its whole model) is on disk.
    stop = lambda: (tmp_path / "model.csv").exists()  # noqa: E731
    partial = fake_profile(tmp_path, chain(*LAYERS), make_devices(first_clock), batch_sizes=BATCHES, should_stop=stop)
    assert partial.metadata["status"] == "interrupted"
    assert set(zip(partial.summary.device, partial.summary.batch_size)) == {("cpu:0", 8)}
    assert len(partial.summary) == len(LAYERS) and len(partial.model) == 1

    clock = FakeClock()
    final = fake_profile(tmp_path, chain(*LAYERS), make_devices(clock), batch_sizes=BATCHES, resume=True)
    assert final.complete and final.metadata["resumed"] == 1
    for device in PER_SAMPLE:
        for batch in BATCHES:
            compiled = [e.target for e in clock.compiles(device=device, batch=batch)]
            expected = [] if (device, batch) == ("cpu:0", 8) else [*LAYERS, MODEL_LAYER]
            assert compiled == expected, (device, batch)
    keys = [CellKey.of("layer", r.layer, r.device, r.batch_size, r.mode) for r in final.summary.itertuples()]
    assert len(keys) == len(set(keys)) == len(LAYERS) * len(PER_SAMPLE) * len(BATCHES)
    assert len(final.model) == len(PER_SAMPLE) * len(BATCHES)
    per_cell = final.samples.groupby(["target", "layer", "device", "batch_size"]).size()
    assert len(per_cell) == (len(LAYERS) + 1) * len(PER_SAMPLE) * len(BATCHES)
    assert (per_cell >= 10).all()


def test_fake_profiling_imports_no_framework(tmp_path):
    code = (
        "import sys\n"
        "from tbs.testing import FakeClock, FakeDevice, chain, fake_profile\n"
        "clock = FakeClock()\n"
        "devices = [FakeDevice('cpu', 0, clock, {}), FakeDevice('gpu', 0, clock, {})]\n"
        f"profile = fake_profile({str(tmp_path)!r}, chain('a', 'b'), devices, batch_sizes=[2])\n"
        "assert profile.complete and len(profile.summary) == 4\n"
        "print([m for m in ('keras', 'tensorflow', 'jax', 'jaxlib') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_dag_records_its_graph_and_the_model_costs_all_its_layers(tmp_path):
    layers = [FakeLayer(name) for name in ("stem", "left", "right", "add")]
    model = FakeModel(layers, inputs_of={"right": ["stem"], "add": ["left", "right"]})
    clock = FakeClock()
    device = FakeDevice("cpu", 0, clock, {"stem": 1e-3, "left": 2e-3, "right": 3e-3, "add": 4e-4})
    profile = fake_profile(tmp_path, model, [device], batch_sizes=[4])
    edges = {(e["src"], e["dst"]) for e in profile.metadata["graph"]["4"]}
    assert edges == {("/input/x", "stem"), ("stem", "left"), ("stem", "right"), ("left", "add"), ("right", "add"),
                     ("add", "/output")}
    assert [layer["name"] for layer in profile.metadata["layers"]] == ["stem", "left", "right", "add"]
    assert profile.model.median_s.iloc[0] == pytest.approx(1e-3 + 2e-3 + 3e-3 + 4e-4, rel=1e-6)


def test_calls_back_to_back_and_single_calls_are_timed_apart_only_where_a_sample_holds_several(tmp_path):
    """One call that fills a sample (>= min_block_seconds) leaves nothing to overlap, and each of its
    samples already is one call: neither is timed again. A short model gets both."""
    clock = FakeClock()
    script = {"dense": 1e-5, "relu": 1e-6, MODEL_LAYER: lambda b: 1e-3 * b}  # batch 2: 2 ms; batch 64: 64 ms
    device = FakeDevice("cpu", 0, clock, script, harness_call_seconds=HARNESS_CALL_S,
                        harness_iteration_seconds=HARNESS_ITERATION_S, overlap=0.5)
    profile = fake_profile(tmp_path, chain("dense", "relu"), [device], batch_sizes=(2, 64))
    model = profile.model.set_index("batch_size")
    phases = profile.samples[profile.samples.target == "model"].groupby("batch_size").phase.unique()
    assert set(phases[2]) == {"forward", "overlapped"} and list(phases[64]) == ["forward"]
    assert model.overlapped_s[2] == pytest.approx(1e-3, rel=1e-6)  # half of one 2 ms call
    assert np.isnan(model.overlapped_s[64]) and model.iterations[64] == 1
    long_calls = [e for e in clock.events if e.target == MODEL_LAYER and e.batch == 64 and e.iterations == 1]
    assert len(long_calls) == 2 + model.n[64]  # calibration's two, then its samples: no single calls after
    short_singles = [e for e in clock.events if e.target == MODEL_LAYER and e.batch == 2 and e.iterations == 1]
    assert len(short_singles) >= 5  # calibration's first call and the single calls after sampling
    for batch in (2, 64):  # either way the dispatch overhead is one call's harness cost
        assert model.dispatch_overhead_s[batch] == pytest.approx(HARNESS_CALL_S + HARNESS_ITERATION_S, rel=1e-6)


@pytest.mark.parametrize("limit_bytes, collections", [(1, 4), (10**18, 0), (None, 4)])
def test_garbage_is_collected_between_groups_only_where_their_programs_hold_memory_that_matters(
        tmp_path, monkeypatch, limit_bytes, collections):
    """A full collection costs ~0.2 s with TensorFlow loaded: worth it for big activations, not tiny ones.

    Against what each device can still hold: the host's headroom for the CPU, its own memory for the
    GPU; where that is not known, always."""
    import gc

    from tbs.measure import headroom

    counted: list[int] = []
    monkeypatch.setattr(headroom, "memory_headroom_bytes", lambda: limit_bytes)
    monkeypatch.setattr(gc, "collect", lambda *a: counted.append(1) or 0)
    clock = FakeClock()
    devices = make_devices(clock)
    devices[1].memory_bytes = limit_bytes
    profile = fake_profile(tmp_path, chain(*LAYERS), devices, batch_sizes=BATCHES)
    assert profile.complete and len(counted) == collections  # 2 batches x 2 devices: after each group, or never


@pytest.mark.parametrize("prices, said", [
    ({"cpu": 0.5}, []),  # every price has a device
    ({"cpu:0": 0.5}, []),
    ({"cpu": 0.5, "gpu": 3.0}, ["gpu=3 $/h prices nothing in this profile: no gpu here (no driver here)"]),
    ({"gpu:0": 3.0}, ["gpu:0=3 $/h prices nothing in this profile: gpu:0 is not among the devices this run measures"]),
    ({"cpu:1": 2.0}, ["cpu:1=2 $/h prices nothing in this profile: no cpu:1 here (no such device on this machine)"]),
    ({"tpu": 1.0}, []),  # --devices cpu,tpu: the device selection already said why tpu was skipped
])
def test_a_price_for_a_device_this_run_lacks_is_said_once_with_why(prices, said):
    """gpu=3 on a CPU machine priced nothing in silence; a GPU left out by --devices is not 'missing'."""
    from types import SimpleNamespace

    from tbs.backends.base import Discovery
    from tbs.run import Run

    clock = FakeClock()
    cpu, gpu = FakeDevice("cpu", 0, clock, {}), FakeDevice("gpu", 0, clock, {})
    run, warned = object.__new__(Run), []
    run.options = SimpleNamespace(prices=prices, device_tokens=["cpu", "tpu"] if "tpu" in prices else None)
    run.warn, run.devices = warned.append, [cpu]
    run.discovery = Discovery([cpu, gpu] if "gpu:0" in prices else [cpu], {} if "gpu:0" in prices else
                              {"gpu": "no driver here"})
    run._prices_without_a_device()
    assert [w.split(";")[0] for w in warned] == said
