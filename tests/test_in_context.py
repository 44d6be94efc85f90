"""In-context attribution: each layer's share of a few traced whole-model calls, and the trace a user opens.

The arithmetic (ops to layers, a fused kernel shared by its layers' work, overlapping ops, the framework's own
time) is pinned on hand-made ops; the tracing on real TensorFlow (in this process) and JAX (the JAX tests' one
process) with a model whose fusion is known (``keras_models.fusion_model``): Conv + BatchNorm + ReLU (one XLA
loop fusion of the conv's bias, the normalisation and the ReLU: shared by the three layers), Dense + Activation
(Grappler's _FusedMatMul, XLA's bias+activation loop fusion) and a Dropout that leaves no kernel in inference.
Then a profile through the CLI: its ops.csv, its in-model columns, `--no-in-context`, a profile without
ops.csv, and the trace JSON.
"""

from __future__ import annotations

import json
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import FAST
from keras_models import _pickle, fusion_model, keras
from tbs.cli import cli
from tbs.measure.in_context import CALL, OP, SLOW_CALL, attribute, explain, layer_of, op_rows

BASE = {"device": "cpu:0", "batch_size": 4, "mode": "inference"}


def _call(i: int, start: float, seconds: float) -> dict:
    return dict(BASE, kind=CALL, call=i, name="", start_s=start, duration_s=seconds, parts="", tool="test")


def _op(i: int, name: str, start: float, seconds: float, parts: list) -> dict:
    return dict(BASE, kind=OP, call=i, name=name, start_s=start, duration_s=seconds, parts=json.dumps(parts), tool="test")


def test_a_fused_kernel_is_split_by_work_between_its_layers_and_the_rest_is_the_frameworks():
    rows = [_call(0, 0.0, 10e-6),
            _op(0, "conv", 0.0, 4e-6, [["jit(f)/m/conv/conv_general_dilated", 100.0]]),
            _op(0, "fusion", 4e-6, 4e-6, [["jit(f)/m/conv/add", 1.0], ["jit(f)/m/bn/mul", 1.0],
                                          ["jit(f)/m/relu/max", 2.0]]),
            _op(0, "copy", 9e-6, 1e-6, [["values[3]", 1.0]])]  # names no layer: the framework's
    found = attribute(rows, ["conv", "bn", "relu"])
    assert found.layer_s == pytest.approx({"conv": 5e-6, "bn": 1e-6, "relu": 2e-6})
    assert found.shared_s == pytest.approx({"conv": 1e-6, "bn": 1e-6, "relu": 2e-6})
    assert found.shared_with["relu"] == {"conv", "bn"}
    assert found.unowned_s == pytest.approx(2e-6)  # the 1 µs gap and the copy
    assert sum(found.layer_s.values()) + found.unowned_s == pytest.approx(found.whole_s)
    assert explain("relu", 2e-6, 4e-6, found).startswith("fused with bn, conv")
    assert "shares a kernel with bn, relu" in explain("conv", 5e-6, 5e-6, found)


def test_overlapping_ops_split_the_time_they_share_and_calls_are_averaged():
    rows = [_call(0, 0.0, 6e-6), _call(1, 1.0, 6e-6),
            _op(0, "a", 0.0, 4e-6, [["m/dense/MatMul", 1.0]]), _op(0, "b", 2e-6, 4e-6, [["m/act/Relu", 1.0]]),
            _op(1, "a", 1.0, 4e-6, [["m/dense/MatMul", 1.0]]), _op(1, "b", 1.0 + 2e-6, 4e-6, [["m/act/Relu", 1.0]])]
    found = attribute(rows, ["dense", "act"])
    assert found.calls == 2 and found.whole_s == pytest.approx(6e-6)
    assert found.layer_s == pytest.approx({"dense": 3e-6, "act": 3e-6})  # 2 alone + half of the 2 shared
    assert found.unowned_s == pytest.approx(0.0, abs=1e-12)
    assert "overlapped with act" in explain("dense", 3e-6, 3e-6, found)


def test_a_call_disturbed_by_the_machine_is_left_out_of_the_mean_and_the_rest_still_add_up():
    # Three calls of one gather: 0.4 ms twice, and once descheduled mid-op for 8.6 ms (seen on a shared VM).
    rows = []
    for i, (start, gather) in enumerate([(0.0, 4e-4), (1.0, 8.6e-3), (2.0, 4.2e-4)]):
        rows += [_call(i, start, gather + 1e-4), _op(i, "g", start, gather, [["m/embedding/GatherV2", 1.0]]),
                 _op(i, "t", start + gather, 1e-4, [["m/lstm/transpose", 1.0]])]
    found = attribute(rows, ["embedding", "lstm"])
    assert found.calls == 2 and found.layer_s["embedding"] == pytest.approx(4.1e-4)
    assert found.layer_s["embedding"] + found.layer_s["lstm"] + found.unowned_s == pytest.approx(found.whole_s)


def test_an_op_path_names_the_innermost_layer_even_with_tensorflows_scope_suffixes():
    names = ["dense", "dense_1", "augment/random_rotation", "conv"]
    assert layer_of("model_1/conv_1/convolution", names) == "conv"
    assert layer_of("m/dense_1/MatMul", names) == "dense_1"  # an exact name wins over a suffixed one
    assert layer_of("m/dense_2/MatMul", names) == "dense"
    assert layer_of("jit(f)/m/augment/random_rotation/add", names) == "augment/random_rotation"
    assert layer_of("values[0]", names) is None


@pytest.fixture(scope="module")
def fusion() -> keras.Model:
    return fusion_model()


def _traced(model: keras.Model, xla: bool, shape: tuple = (12, 12, 3)):
    from tbs.backends.tensorflow.discovery import discover

    device = discover().devices[0]
    x = device.place(np.random.default_rng(0).random((4, *shape), dtype=np.float32))
    traced = device.trace_calls(lambda t: model(t, training=False), [x], xla, model.variables)
    assert traced is not None and len(traced.calls) == 3
    return attribute(op_rows(traced, BASE), [layer.name for layer in model.layers])


def test_tensorflow_graph_ops_dense_and_its_activation_share_grapplers_fused_matmul_and_dropout_has_no_kernel(fusion):
    found = _traced(fusion, xla=False)
    assert found.shared_with["act"] == {"dense"} and found.shared_with["dense"] == {"act"}
    assert found.layer_s.get("drop", 0.0) == 0.0
    assert explain("drop", 0.0, 1e-6, found).startswith("no kernel of its own")
    assert sum(found.layer_s.values()) + found.unowned_s == pytest.approx(found.whole_s, rel=1e-6)


def test_tensorflow_xla_conv_batchnorm_relu_are_one_shared_loop_fusion(fusion):
    found = _traced(fusion, xla=True)
    assert found.tool == "tf.profiler (XLA kernels)"
    assert {"bn", "relu"} <= found.shared_with["conv"]
    assert found.shared_s["bn"] > 0 and found.shared_s["relu"] > 0
    assert sum(found.layer_s.values()) + found.unowned_s == pytest.approx(found.whole_s, rel=1e-6)


def test_jax_xla_kernels_are_attributed_and_shared_where_fused(jax_run):
    import tbs

    profile = tbs.load(jax_run["paths"]["fusion_jax"])
    assert profile.meta.in_context["cpu:0@4"]["tool"] == "jax.profiler (XLA kernels)"
    summary = profile.summary.set_index("layer")
    for fused in ("conv", "bn", "relu"):  # the conv's bias, the normalisation and the ReLU: one loop fusion
        assert summary.loc[fused, "in_model_shared_s"] > 0, summary.loc[fused, "in_model_note"]
    assert "bn" in summary.loc["conv", "in_model_note"] and "relu" in summary.loc["conv", "in_model_note"]
    assert "dense" in summary.loc["act", "in_model_note"]  # Dense's bias add and the ReLU: one loop fusion
    assert summary.loc["drop", "in_model_s"] == 0.0
    model = profile.model.iloc[0]
    assert summary["in_model_s"].sum() + model["unowned_s"] == pytest.approx(model["in_model_s"], rel=1e-6)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("in_context")
    model = _pickle(fusion_model(), root / "fusion.pkl")
    runner = CliRunner()
    with_trace, without = root / "traced", root / "untraced"
    for out, extra in ((with_trace, []), (without, ["--no-in-context"])):
        result = runner.invoke(cli, ["profile", str(model), "--batch", "4", "--out", str(out), *FAST, *extra])
        assert result.exit_code == 0, result.output
    return {"traced": with_trace, "untraced": without, "runner": runner}


def test_a_profile_keeps_its_traced_ops_and_its_layers_in_model_times(profiled):
    import tbs

    profile = tbs.load(profiled["traced"])
    calls = profile.ops[profile.ops["kind"] == CALL]
    assert len(calls) == 3 and (profile.ops["kind"] == OP).sum() > 0
    summary = profile.summary.set_index("layer")
    assert summary.loc["dense", "in_model_s"] > 0 and "act" in summary.loc["dense", "in_model_note"]
    assert summary.loc["drop", "in_model_s"] == 0.0
    model = profile.model.iloc[0]
    total = summary["in_model_s"].sum() + model["unowned_s"]
    assert total == pytest.approx(model["in_model_s"], rel=1e-6)
    # A call disturbed by the shared machine (over SLOW_CALL times the median span) is left out of the mean:
    # the count kept is what the spans say, never fewer than two of three (the median's and the one below it).
    spans = calls["duration_s"].astype(float)
    kept = int((spans <= SLOW_CALL * spans.median()).sum())
    assert kept >= 2 and model["traced_calls"] == kept and model["model_share"] == 1.0
    assert profile.meta.in_context["cpu:0@4"]["calls"] == 3
    text = profiled["runner"].invoke(cli, ["report", str(profiled["traced"])]).output
    assert "in model" in text and "the framework's own" in text
    on_disk = (profiled["traced"] / "summary.csv").read_text().splitlines()[0]
    assert "in_model_s" in on_disk and "in_model_note" in on_disk


def test_no_in_context_traces_nothing_and_a_profile_without_ops_reads_blank(profiled):
    import tbs

    profile = tbs.load(profiled["untraced"])
    assert profile.ops.empty and profile.summary["in_model_s"].isna().all()
    assert profile.model["in_model_s"].isna().all()
    old = profiled["traced"].parent / "old"
    old.mkdir()
    for name in ("summary.csv", "model.csv", "samples.csv", "metadata.json"):  # written before this change
        (old / name).write_text((profiled["traced"] / name).read_text())
    profile = tbs.load(old)
    assert profile.summary["in_model_s"].isna().all() and profile.model["unowned_s"].isna().all()
    result = profiled["runner"].invoke(cli, ["report", str(old)])
    assert result.exit_code == 0 and "in model" not in result.output


def test_the_trace_loads_as_json_with_each_op_inside_its_layers_span_and_the_isolated_cells(profiled, tmp_path):
    out = tmp_path / "trace.json"
    result = profiled["runner"].invoke(cli, ["report", str(profiled["traced"]), "--format", "trace", "-o", str(out)])
    assert result.exit_code == 0, result.output
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert "cpu:0 (tensorflow)" in names and "batch 4: in context" in names
    assert any(n.startswith("batch 4: isolated") for n in names)
    spans = [e for e in events if e["ph"] == "X"]
    calls = [e for e in spans if e["cat"] == "call"]
    assert [e["name"] for e in calls] == ["whole model call 1", "whole model call 2", "whole model call 3"]
    layer_spans = [e for e in spans if e["cat"] == "layer"]
    assert any(e["name"] == "act + dense" and e["args"]["shared"] for e in layer_spans)
    for op in (e for e in spans if e["cat"] == "op"):  # each op nests in a layer span of its own thread
        assert any(s["tid"] == op["tid"] and s["ts"] <= op["ts"] and op["ts"] + op["dur"] <= s["ts"] + s["dur"] + 1e-3
                   for s in layer_spans)
    isolated = [e for e in spans if e["cat"] == "isolated layer"]
    assert [e["name"] for e in isolated] == ["conv", "bn", "relu", "pool", "dense", "act", "drop", "out"]
    assert all(b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-2) for a, b in zip(isolated, isolated[1:]))
    assert [e["name"] for e in spans if e["cat"] == "isolated model"] == ["whole model"]
    printed = profiled["runner"].invoke(cli, ["report", str(profiled["traced"]), "--format", "trace"])
    assert json.loads(printed.output)["traceEvents"]


def test_tensorflow_nodes_are_named_by_the_keras_call_that_made_them_not_by_their_uniquified_scope():
    # TensorFlow runs layer ``dense`` under scope ``dense_1`` and layer ``dense_1`` under ``dense_1_2``.
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, name="dense"),
                              keras.layers.Dense(2, name="dense_1")], name="seq")
    from tbs.backends.tensorflow.discovery import discover

    device = discover().devices[0]
    x = device.place(np.ones((4, 32), np.float32))
    traced = device.trace_calls(lambda t: model(t, training=False), [x], False, model.variables)
    paths = {path for op in traced.ops for path, _ in op.parts}
    assert {"seq/dense/MatMul", "seq/dense_1/MatMul"} <= paths, sorted(paths)
    found = attribute(op_rows(traced, BASE), ["dense", "dense_1"])
    assert found.layer_s["dense"] > 0 and found.layer_s["dense_1"] > 0


def test_a_layer_before_an_rnn_keeps_its_nodes_the_cells_loop_body_is_another_graph():
    # The LSTM's cell is called inside its while loop's body graph: its node positions there must not be read
    # as the outer graph's, where they would land on the Embedding's nodes (its gather named the LSTM cell's).
    from tbs.backends.tensorflow.environment import tensorflow
    from tbs.backends.tensorflow.trace import keras_paths

    tokens = keras.Input((12,), dtype="int32")
    hidden = keras.layers.LSTM(8, name="lstm")(keras.layers.Embedding(50, 16, name="embedding")(tokens))
    model = keras.Model(tokens, keras.layers.Dense(1, name="dense")(hidden), name="rnn")
    function = tensorflow().function(lambda t: model(t, training=False), autograph=False)
    _, paths = keras_paths(function, [tensorflow().constant(np.ones((2, 12), np.int32))])
    gathers = {name: path for name, path in paths.items() if name.endswith("/GatherV2")}
    assert gathers and set(gathers.values()) == {"rnn/embedding"}, gathers
    assert any(path == "rnn/lstm" for path in paths.values())


def test_kernels_without_a_run_id_are_split_into_their_calls_at_the_widest_idle_gaps():
    # A GPU's kernels as CUPTI records them: hlo_op and hlo_module, no run_id. Three calls of three kernels, 2 us
    # apart inside a call, 400 us between calls (the host's wait and the next dispatch), one gap of 30 us in a call.
    from tbs.backends import xla_trace
    from tbs.backends.jax.trace import ops_of

    events, t = [], 0.0
    for call in range(3):
        for i, (name, ns) in enumerate((("convolution.1", 50e3), ("fusion.2", 8e3), ("dot.3", 20e3))):
            events.append((f"kernel_{name}", t, ns, {"hlo_op": name, "hlo_module": "jit_forward"}))
            t += ns + (30e3 if (call, i) == (1, 0) else 2e3)
        events.append(("other_module_kernel", t, 1e3, {"hlo_op": "copy.9", "hlo_module": "jit_other"}))
        t += 400e3
    runs = xla_trace.kernels(events, module="jit_forward", calls=3)
    assert [[name for name, _, _ in run] for run in runs] == [["convolution.1", "fusion.2", "dot.3"]] * 3
    assert xla_trace.kernels(events, module="jit_forward") != runs  # without the count: one run (as before)
    traced = ops_of(events, "jit_forward", {}, calls=3)  # the first call is the profiler's warm-up: left out
    assert len(traced.calls) == 2 and traced.calls[0][1] == pytest.approx((50e3 + 30e3 + 8e3 + 2e3 + 20e3) / 1e9)
