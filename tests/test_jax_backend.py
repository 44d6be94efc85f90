"""The JAX backend: devices, blocked compiled timing, profiles, unsupported layers, merged reports, --verify.

Keras picks its backend once per process and this test process runs TensorFlow,
so JAX profiles run through a real subprocess (``tbs profile --backend jax``; conftest.jax_run, the one JAX
process it shares with test_training.py's JAX part);
the JAX device itself is tested here directly on plain JAX functions.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'tbs[jax]')")

from tbs import backends as backend  # noqa: E402
from tbs.cli import cli  # noqa: E402
from tbs.backends.jax.device import STRINGS_UNSUPPORTED, JaxDevice  # noqa: E402
from tbs.backends.jax.discovery import discover  # noqa: E402

@pytest.fixture(scope="module")
def jax_dirs(jax_run: dict[str, Any]) -> dict[str, Any]:
    """The JAX process's profiles (conftest.jax_run: an MLP on two logical CPUs, a string model on cpu:0, and
    ``recommend --verify`` of the MLP's, through the CLI) and a TF profile of the MLP here."""
    paths = jax_run["paths"]
    dirs: dict[str, Any] = {"mlp": paths["mlp_jax"], "text": paths["text_jax"],
                            "mlp_tf": paths["mlp_jax"].parent / "mlp_tf", "verify": jax_run["cli"][2]["stdout"]}
    result = CliRunner().invoke(cli, ["profile", str(paths["mlp"]), "--batch", "32", "--out", str(dirs["mlp_tf"]),
                                      *FAST])
    assert result.exit_code == 0, result.output
    return dirs


def test_jax_devices_are_found_with_reasons_for_missing_kinds() -> None:
    found = discover()
    assert [d.name for d in found.devices if d.kind == "cpu"][:1] == ["cpu:0"]
    assert all(d.backend == "jax" for d in found.devices)
    if not any(d.kind == "gpu" for d in found.devices):
        assert "GPU" in found.missing["gpu"]


def _seconds_per_call(runner, n: int) -> float:
    runner(1)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        runner(n)
        best = min(best, (time.perf_counter() - start) / n)
    return best


def test_blocked_runner_repeats_the_work_and_scales_with_it() -> None:
    """Each loop iteration really runs the call (no hoisting), and time follows the FLOPs."""
    device = discover().devices[0]
    runners = {}
    for size in (128, 512):
        a = device.place(np.random.default_rng(0).random((size, size), dtype=np.float32))
        runners[size] = device.compile_blocked(lambda x: x @ x, [a], False)
    small, large = _seconds_per_call(runners[128], 20), _seconds_per_call(runners[512], 20)
    assert large / small > 8, (small, large)  # 64x the FLOPs: hoisting or a missed sync would flatten this
    few, many = 4, 32
    start = time.perf_counter(); runners[512](few); t_few = time.perf_counter() - start  # noqa: E702
    start = time.perf_counter(); runners[512](many); t_many = time.perf_counter() - start  # noqa: E702
    assert t_many / t_few > 3, (t_few, t_many)


def test_the_harness_loop_is_kept_so_its_cost_per_iteration_is_measured() -> None:
    """The identity harness's loop had nothing to do and XLA deleted it: 0 s an iteration, on an H200 too, where a
    kept loop costs tens of µs an iteration and every layer cell carried it (ResNet50's Σ layers 4.6x its whole)."""
    harness = JaxDevice("cpu", 0, jax.devices("cpu")[0]).harness(True)

    def best_of(iterations: int) -> float:
        harness(iterations)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            harness(iterations)
            times.append(time.perf_counter() - start)
        return min(times)

    assert best_of(200_001) - best_of(1) > 200_000 * 0.5e-9  # the deleted loop: no slower at 200,001 than at 1


def test_elementwise_work_is_timed_in_full_and_views_cost_nothing() -> None:
    """XLA would fuse an elementwise call down to the one element consumed; every element is needed.

    A reshape or pass-through is a view in a compiled model, so it must not be timed as a pass over memory.
    """
    device = discover().devices[0]
    small = device.place(np.ones((64, 64), np.float32))
    large = device.place(np.ones((64, 64 * 256), np.float32))  # 256x the elements
    scale = {n: _seconds_per_call(device.compile_blocked(lambda x: x * 3.0 + 1.0, [x], False), 50)
             for n, x in (("small", small), ("large", large))}
    # Fused down to the consumed element, both would cost the loop's overhead alone (a ratio near 1); timed in
    # full, 256x the bytes reads 15-40x here (the small call is mostly that overhead), so 4 leaves room for noise.
    assert scale["large"] / scale["small"] > 4, scale
    view = _seconds_per_call(device.compile_blocked(lambda x: (x, x.reshape(-1)), [large], False), 50)
    assert view < scale["large"] / 4, (view, scale)


def test_whole_model_runner_times_the_program_a_call_runs() -> None:
    """The whole model's loop writes its outputs out each iteration, as a call that returns them does.

    Summed inside the loop instead, XLA:CPU fused this MLP's four dots and the sum into one kernel that ran
    5-9x slower than the model's own program at batch 512 (Σ layers / whole read 0.2).
    """
    device = discover().devices[0]
    rng = np.random.default_rng(0)
    weights = [device.place(rng.random(shape, dtype=np.float32) / 512)
               for shape in [(512, 512), (512,)] * 3 + [(512, 10), (10,)]]
    x = device.place(rng.random((512, 512), dtype=np.float32))

    def mlp(x: Any, *w: Any) -> Any:  # three Dense(512, relu) and a Dense(10): tests/keras_models.mlp_model
        for kernel, bias in zip(w[:6:2], w[1:6:2]):
            x = jax.nn.relu(x @ kernel + bias)
        return x @ w[6] + w[7]

    plain = jax.jit(mlp)
    returned = _seconds_per_call(lambda n: [jax.block_until_ready(plain(x, *weights)) for _ in range(n)], 3)
    blocked = _seconds_per_call(device.compile_blocked(mlp, [x, *weights], False, outputs_written=True), 3)
    assert 0.5 < blocked / returned < 2.0, (blocked, returned)


def test_string_tensors_make_a_call_unsupported() -> None:
    device = discover().devices[0]
    assert isinstance(device, JaxDevice)
    assert device.unsupported_reason([np.array(["a"], dtype=object)]) == STRINGS_UNSUPPORTED
    assert device.unsupported_reason([np.zeros(3)]) is None


def test_jax_profile_records_backend_and_measures_every_layer(jax_dirs: dict[str, Any]) -> None:
    meta = json.loads((jax_dirs["mlp"] / "metadata.json").read_text())
    assert meta["backend"] == "jax" and meta["status"] == "complete"
    assert "jax" in meta["versions"] and meta["settings"]["xla_jit_compile"].startswith("always")
    assert [d["name"] for d in meta["devices"]] == ["cpu:0", "cpu:1"]
    assert all(d["backend"] == "jax" for d in meta["devices"])
    assert "cpu:0->cpu:1" in meta["transfers"]
    summary = pd.read_csv(jax_dirs["mlp"] / "summary.csv")
    assert set(summary["status"]) <= {"ok", "noisy"}
    assert len(summary) == 2 * 5
    dense = summary[summary["layer"].str.startswith("dense")]
    assert (dense["median_s"] > 0).all()
    samples = pd.read_csv(jax_dirs["mlp"] / "samples.csv")
    assert summary["shared_with"].isna().all()  # --no-dedupe: every layer measured on its own
    assert len(samples) >= summary["n"].sum()


def test_jax_layer_sum_matches_the_whole_compiled_model(jax_dirs: dict[str, Any]) -> None:
    model = pd.read_csv(jax_dirs["mlp"] / "model.csv")
    for _, row in model.iterrows():
        ratio = row["layers_sum_s"] / row["median_s"]
        # Real, not harness (docs/measuring.md, "Remaining gaps"): each Dense's 1 MiB kernel stays in its
        # core's L2 timed alone, the model's three do not, and its whole call falls into a slower mode more
        # often than its layers on a loaded machine: 0.38-0.86 in eleven profiles on 2026-11-26 (0.6 before
        # that day). Still fails on a whole model off by more than 3x either way.
        assert 0.3 < ratio < 1.6, (row["device"], ratio)


def test_string_layers_are_unsupported_on_jax_with_the_reason(jax_dirs: dict[str, Any]) -> None:
    summary = pd.read_csv(jax_dirs["text"] / "summary.csv")
    strings = summary["layer_type"] == "TextVectorization"  # its name depends on earlier tests' models
    assert strings.sum() == 1
    assert summary[strings]["status"].tolist() == ["unsupported"]
    assert "string" in summary[strings]["reason"].iloc[0]
    assert summary[~strings]["status"].isin(["ok", "noisy"]).all()
    model = pd.read_csv(jax_dirs["text"] / "model.csv")
    assert model["status"].tolist() == ["unsupported"]


def test_report_merges_tf_and_jax_profiles_side_by_side(jax_dirs: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "merged.html"
    result = CliRunner().invoke(cli, ["report", str(jax_dirs["mlp_tf"]), str(jax_dirs["mlp"]), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "cpu:0 (tf)" in html and "cpu:0 (jax)" in html and "cpu:1 (jax)" in html
    result = CliRunner().invoke(cli, ["report", str(jax_dirs["mlp_tf"]), str(jax_dirs["mlp"]), "--format", "csv",
                                      "--cost", "cpu=1"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(io.StringIO(result.output))
    per_layer = table[table["layer"] == "dense_1"]
    assert set(per_layer["device"]) == {"cpu:0 (tf)", "cpu:0 (jax)", "cpu:1 (jax)"}
    assert per_layer["cost_per_sample_usd"].notna().all()  # 'cpu' prices every backend's CPU


def test_recommend_verify_runs_a_jax_placement(jax_dirs: dict[str, Any]) -> None:
    assert "Verified by running it" in jax_dirs["verify"]
    assert "5 of 5 layers ran their ops on the device they were placed on" in jax_dirs["verify"]


def test_an_lstm_on_the_host_cpu_of_a_gpu_machine_runs_the_cpus_loop_not_cudnn(jax_run: dict[str, Any]) -> None:
    """On an H200 every LSTM traced for the host CPU took Keras's cuDNN path and failed to compile ('rnn_fwd'
    has no CPU rule): each device's copy of the model now runs the LSTM that device runs (JaxDevice.fit_model)."""
    layer_statuses, model_statuses, placed_right, layers = jax_run["training"]["lstm_in_a_gpu_process"]
    measured = {"ok", "noisy"}  # measured (a loaded machine can leave a cell noisy); the old code's was 'error'
    assert len(layer_statuses) == 2 and set(layer_statuses) <= measured and set(model_statuses) <= measured
    assert model_statuses and placed_right == layers == 2


def test_devices_lists_each_backend() -> None:
    result = CliRunner().invoke(cli, ["devices"])
    assert result.exit_code == 0, result.output
    assert "tensorflow:" in result.output and "jax:" in result.output
    assert result.output.count("cpu:0") >= 2


def test_backend_errors_are_one_line(seq_pkl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keras already runs on TensorFlow in this process: JAX needs a new one, and says so.
    result = CliRunner().invoke(cli, ["profile", str(seq_pkl), "--backend", "jax", *FAST])
    assert result.exit_code == 2 and "new process" in result.output
    result = CliRunner().invoke(cli, ["profile", str(seq_pkl), "--backend", "torch"])
    assert result.exit_code == 2 and "torch" in result.output
    real = backend.importlib.util.find_spec
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: None if name == "jaxlib" else real(name))
    result = CliRunner().invoke(cli, ["profile", str(seq_pkl), "--backend", "jax"])
    assert result.exit_code == 2 and "pip install 'tbs[jax]'" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = CliRunner().invoke(cli, ["devices", "--backend", "jax"])
    assert "unavailable: jax is not installed" in result.output
