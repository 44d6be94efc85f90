"""Why a layer costs what it does: the compiler's FLOPs, bytes and memory, calibration, the roofline.

Real TensorFlow (and JAX on plain functions) on tiny programs: the FLOPs XLA counts for a
Dense and a Conv2D agree with the textbook count and scale with the batch; bytes scale with
the tensors; a profile carries them per cell and per phase, with each device's ceilings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from keras_models import keras, layers
from tbs.backends.base import ProgramCost
from tbs.backends.tensorflow.discovery import discover
from tbs.measure.analysis import formula_cost, phase_costs, row_columns
from tbs.profiles.roofline import bound_of, with_roofline

FAST = dict(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)


@pytest.fixture(scope="module")
def cpu():
    return discover().devices[0]


def _cost(device, layer, batch: int, shape: tuple[int, ...]) -> ProgramCost:
    x = np.random.default_rng(0).random((batch, *shape), dtype=np.float32)
    layer(x)  # build
    return device.program_cost(lambda t: layer(t), [device.place(x)], False, layer.variables)


def test_dense_and_conv_flops_match_the_textbook_and_scale_with_batch(cpu):
    dense, conv = layers.Dense(128), layers.Conv2D(16, 3)
    for batch in (8, 32):
        d = _cost(cpu, dense, batch, (256,))
        assert d.source.startswith("xla")
        assert d.flops == pytest.approx(2 * batch * 256 * 128, rel=0.03)  # + bias adds only batch*128
        c = _cost(cpu, conv, batch, (20, 20, 3))
        assert c.flops == pytest.approx(2 * batch * 18 * 18 * 16 * 3 * 3 * 3, rel=0.05)
        # Bytes: at least the input, the weights and the output, each read or written once.
        tensors = 4 * (batch * 256 + 256 * 128 + batch * 128)
        assert tensors <= d.bytes_accessed <= 3 * tensors
        assert d.bytes_unoptimized >= d.bytes_accessed  # XLA's passes never add traffic here
    small, large = _cost(cpu, dense, 8, (256,)), _cost(cpu, dense, 32, (256,))
    assert large.flops / small.flops == pytest.approx(4, rel=0.01)
    grown, activations = large.bytes_accessed - small.bytes_accessed, 4 * 24 * (256 + 128)
    assert activations <= grown <= 2 * activations  # only the activations grow (the output may be read back)


def test_jax_analysis_of_a_plain_program():
    jax = pytest.importorskip("jax")
    from tbs.backends.jax.discovery import discover as jax_discover

    device = jax_discover().devices[0]
    x, w = np.ones((64, 100), np.float32), np.ones((100, 30), np.float32)
    cost = device.program_cost(lambda a, b: jax.numpy.dot(a, b), [x, w], True)
    assert cost.source == "xla" and cost.flops == pytest.approx(2 * 64 * 100 * 30)
    assert cost.argument_bytes == 4 * (64 * 100 + 100 * 30) and cost.output_bytes == 4 * 64 * 30


def test_string_ops_fall_back_to_tensorflow_graph_statistics(cpu):
    tf = pytest.importorskip("tensorflow")
    strings = tf.constant(["a b", "c"])
    cost = cpu.program_cost(lambda s: tf.strings.split(s).to_tensor(), [strings], False)
    assert cost.source == "tensorflow graph statistics"
    assert "XLA cannot compile it" in cost.reason and cost.bytes_accessed is None


def test_shape_formulas_stand_in_where_the_compiler_says_nothing():
    class Call:
        name, category, params = "d", "dense", 256 * 128 + 128
        input_shapes, output_shapes = [[32, 256]], [[32, 128]]
        input_bytes, output_bytes = 32 * 256 * 4, 32 * 128 * 4

    cost = formula_cost(Call(), "no compiler analysis")
    assert cost.source == "formula" and cost.flops == pytest.approx(2 * 32 * 256 * 128)


def test_tensorflow_backward_is_forward_backward_less_forward():
    both = ProgramCost("xla", flops=30.0, bytes_accessed=300.0)
    forward = ProgramCost("xla", flops=10.0, bytes_accessed=100.0)
    costs = phase_costs({"forward": forward, "forward+backward": both, "update": ProgramCost("xla", 5.0, 50.0)})
    assert list(costs) == ["forward", "backward", "update"]
    assert costs["backward"].flops == 20.0 and costs["backward"].bytes_accessed == 200.0
    assert row_columns(costs)["flops"] == 35.0
    assert row_columns({"forward": forward, "update": ProgramCost("xla")})["flops"] is None  # a blank, not a partial sum


def test_bounds_from_the_roofline():
    calibration = {"cpu:0": {"matmul_flops_per_s": {"float32": 1e11}, "memory_bytes_per_s": 1e10}}
    frame = pd.DataFrame({"device": ["cpu:0"] * 3, "median_s": [1e-3, 1e-3, 1e-3],
                          "flops": [1e8, 1e3, 1e3], "bytes_accessed": [1e3, 1e7, 1e3]})
    out = with_roofline(frame, calibration)
    assert list(out["bound"]) == ["compute", "memory", "overhead"]
    assert out["fraction_of_roofline"].iloc[0] == pytest.approx(1.0)
    assert out["achieved_flops_per_s"].iloc[0] == pytest.approx(1e11)
    assert with_roofline(frame, None)["bound"].isna().all()  # no calibration: no verdict
    assert bound_of(0.0, 0.0, 1.0) == "overhead"


def test_a_profile_carries_analysis_calibration_and_memory(tmp_path):
    import tbs

    inputs = keras.Input((64,), name="x")
    model = keras.Model(inputs, layers.Dense(8, name="out")(layers.Dense(32, activation="relu", name="hidden")(inputs)))
    p = tbs.profile(model, [4, 16], devices="cpu", timing=tbs.TimingConfig(**FAST), progress=None, report=False,
                    out=tmp_path / "p")
    s = p.summary.set_index(["layer", "batch_size"])
    assert s.loc[("hidden", 16), "flops"] == pytest.approx(4 * s.loc[("hidden", 4), "flops"], rel=0.02)
    assert s.loc[("hidden", 4), "cost_source"].startswith("xla")
    assert set(p.analysis["phase"]) == {"forward"} and len(p.analysis) == len(p.summary) + len(p.model)
    calibration = p.metadata["calibration"]["cpu:0"]
    assert calibration["matmul_flops_per_s"]["float32"] > 1e9 and calibration["memory_bytes_per_s"] > 1e8
    assert p.summary["bound"].isin(["compute", "memory", "overhead"]).all()
    assert (p.model["memory_bytes"] > 0).all()
    capacity = p.metadata["capacity"]["cpu:0"]
    assert capacity["bytes_per_sample"] > 0 and capacity["estimated_batch"] > 16 and capacity["tries"] == []
    assert "hold more than XLA's compiled program" in capacity["note"]  # TensorFlow graphs: the estimate is high
    written = pd.read_csv(tmp_path / "p" / "summary.csv")
    assert {"flops", "bytes_accessed", "flops_unoptimized", "bytes_unoptimized", "bound"} <= set(written.columns)


def test_a_tensorflow_training_profile_analyses_every_phase(tmp_path):
    import tbs

    inputs = keras.Input((32,), name="x")
    hidden = layers.Dense(64, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, layers.Dense(4, name="out")(hidden))
    p = tbs.profile(model, [8], devices="cpu", training=True, timing=tbs.TimingConfig(**FAST), progress=None,
                    report=False, out=tmp_path / "t")
    hidden_phases = p.analysis[p.analysis["layer"] == "hidden"].set_index("phase")
    assert list(hidden_phases.index) == ["forward", "backward", "update"]
    forward, backward = hidden_phases.loc["forward", "flops"], hidden_phases.loc["backward", "flops"]
    assert forward == pytest.approx(2 * 8 * 32 * 64, rel=0.1)
    assert 1.0 < backward / forward < 3.0  # the weight gradient, and the input's: "hidden" reads the model input
    assert hidden_phases.loc["backward", "reason"] == "forward+backward program less the forward"
    assert set(p.analysis.loc[p.analysis["target"] == "model", "phase"]) == {"step"}
    row = p.summary.set_index("layer").loc["hidden"]
    assert row["flops"] == pytest.approx(hidden_phases["flops"].sum())


def test_the_analysis_compile_at_llvm_level_0_counts_and_sizes_what_the_default_compile_does():
    """The counts and memory come from HLO passes and buffer assignment, before code generation: compiling
    the never-run analysis program at LLVM's level 0 (0.63x the time) must change none of them."""
    from tbs.backends import xla
    from tbs.backends.tensorflow.environment import tensorflow

    tf = tensorflow()
    conv, dense = layers.Conv2D(8, 3, activation="relu"), layers.Dense(16)
    x = tf.constant(np.random.default_rng(0).random((4, 12, 12, 3), dtype=np.float32))

    def program(t):
        return dense(tf.reduce_mean(conv(t), axis=(1, 2)))

    program(x)  # build
    serialized = tf.function(program, jit_compile=True).experimental_get_compiler_ir(x)(stage="hlo_serialized")
    default = xla.hlo_compiled(serialized, llvm_level=None)
    assert xla.ANALYSIS_LLVM_LEVEL == 0
    assert xla.hlo_compiled(serialized) == default
    assert default[1]["flops"] > 0 and default[2]["temp_bytes"] is not None


def test_jax_compiles_a_cpu_programs_analysis_at_llvm_level_0_and_counts_what_the_default_does(monkeypatch):
    jax = pytest.importorskip("jax")
    from tbs.backends import xla
    from tbs.backends.jax import analysis

    def program(x, w, k):
        y = jax.nn.relu(x @ w).reshape(4, 8, 8, 4).transpose(0, 3, 1, 2)
        return jax.numpy.tanh(jax.lax.conv_general_dilated(y, k, (1, 1), "SAME")).sum(axis=(2, 3))

    args = (jax.numpy.ones((4, 64)), jax.numpy.ones((64, 256)), jax.numpy.ones((8, 4, 3, 3)))
    lowered = jax.jit(program).lower(*args)
    default = lowered.compile()
    asked = []
    compile_ = type(lowered).compile
    monkeypatch.setattr(type(lowered), "compile", lambda self, compiler_options=None:
                        asked.append(compiler_options) or compile_(self, compiler_options=compiler_options))
    cost = analysis.lowered_cost(program, *args)
    assert asked == [{"xla_backend_optimization_level": xla.ANALYSIS_LLVM_LEVEL,
                      "xla_disable_hlo_passes": xla.ANALYSIS_DISABLED_PASSES}]
    memory, counts = default.memory_analysis(), xla.cost_fields(default.cost_analysis())
    assert (cost.flops, cost.bytes_accessed) == (counts["flops"], counts["bytes_accessed"])
    assert (cost.temp_bytes, cost.output_bytes) == (memory.temp_size_in_bytes, memory.output_size_in_bytes)


def test_a_tensorflow_programs_kernels_name_the_keras_layer_not_the_uniquified_scope(cpu):
    """A model called before gets scopes ``dense_1/`` for its layer ``dense`` and ``dense_1_2/`` for ``dense_1``
    in a new trace; each kernel keeps the Keras call that made it, so a layer's share of the whole is its own."""
    import json

    inputs = keras.Input((64,))
    model = keras.Model(inputs, layers.Dense(4, name="dense_1")(layers.Dense(256, name="dense")(inputs)))
    x = np.random.default_rng(0).random((8, 64), dtype=np.float32)
    model(x)
    model(x)  # traced again under a uniquified scope
    cost = cpu.program_cost(lambda t: model(t), [cpu.place(x)], False, model.variables)
    gemms = {(k["n"], k["k"]): k["op"] for k in json.loads(cost.kernels) if k["kind"] == "gemm"}
    assert gemms[256, 64].split("/")[-2] == "dense" and gemms[4, 256].split("/")[-2] == "dense_1"


def test_a_half_precision_gemm_is_analysed_as_a_gpu_runs_it_on_half_precision_operands(cpu):
    """A CPU has no FP16 GEMM: its compile turns one into an FP32 GEMM between converts. A GPU's kernels are the
    casts the model asks for (its input and its weights to float16) and one GEMM reading and writing float16."""
    import json

    dense = layers.Dense(128, dtype="mixed_float16")
    x = np.random.default_rng(0).random((32, 256), dtype=np.float32)
    dense(x)
    kernels = json.loads(cpu.program_cost(lambda t: dense(t), [cpu.place(x)], False, dense.variables).kernels)
    gemms = [k for k in kernels if k["kind"] == "gemm"]
    assert len(gemms) == 1 and gemms[0]["bytes"] == 2 * (32 * 256 + 256 * 128 + 32 * 128)
    casts = sorted(k["bytes"] for k in kernels if k["kind"] == "memory" and not k.get("epilogue"))
    assert casts == [(4 + 2) * 32 * 256, (4 + 2) * 256 * 128]  # each read as float32, written as float16
