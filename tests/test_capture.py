"""Capture must see every leaf call, with real arguments, in all four model shapes."""

import numpy as np

from keras_models import branchy_model, embedding_model, keras, sequential_model
from tbs.capture.recorder import capture
from tbs.load.inputs import input_specs, structure_inputs, synthetic_batch
from tbs.load.model import import_custom_objects


def _capture(model, batch=3, training=False):
    inputs = structure_inputs(model, synthetic_batch(input_specs(model), batch))
    return capture(model, inputs, training)


def test_sequential_records_each_layer_with_batch_shapes():
    cap = _capture(sequential_model(), batch=5)
    assert [c.name for c in cap.calls] == ["dense", "dropout", "dense_1"]
    assert cap.calls[0].input_shapes == [[5, 6]] and cap.calls[0].output_shapes == [[5, 8]]
    assert cap.calls[0].params == 6 * 8 + 8
    assert cap.calls[0].input_bytes == 5 * 6 * 4


def test_functional_dag_nested_multi_io_graph():
    model = branchy_model()
    cap = _capture(model)
    names = [c.name for c in cap.calls]
    assert names[:7] == ["augment/random_flip", "augment/rescaling", "left", "right", "merge", "pool", "join"]
    assert set(names[7:]) == {"head_a", "head_b"}
    edges = {(e.src, e.dst) for e in cap.edges}
    assert ("augment/rescaling", "left") in edges and ("augment/rescaling", "right") in edges
    assert ("left", "merge") in edges and ("right", "merge") in edges
    assert ("/input/extra", "join") in edges and ("pool", "join") in edges
    assert ("head_a", "/output") in edges and ("head_b", "/output") in edges
    merge_in = [e for e in cap.edges if e.dst == "merge"]
    assert all(e.bytes == 3 * 8 * 8 * 4 * 4 for e in merge_in)
    # every leaf layer of the model appears exactly once
    leaves = [l for l in model._flatten_layers(include_self=False) if not isinstance(l, keras.Model)
              and not isinstance(l, keras.layers.InputLayer)]
    assert len(leaves) == len(names)


def test_training_flag_reaches_every_layer_that_takes_it():
    cap = _capture(sequential_model(), training=True)
    dropout = next(c for c in cap.calls if c.type == "Dropout")
    assert dropout.kwargs.get("training") is True


def test_subclassed_model_and_custom_leaf(custom_source):
    classes = import_custom_objects([custom_source])
    model = classes["TinySubclassed"](units=4)
    model(np.zeros((2, 5), dtype="float32"))
    cap = _capture(model, batch=3)
    assert [c.type for c in cap.calls] == ["Dense", "Doubler", "Dense"]
    assert [(e.src, e.dst) for e in cap.edges][:3] == [
        ("/input/input", cap.calls[0].name), (cap.calls[0].name, cap.calls[1].name),
        (cap.calls[1].name, cap.calls[2].name)]


def test_shared_layer_called_twice_gets_two_cells():
    shared = keras.layers.Dense(3, name="shared")
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    model = keras.Model([a, b], keras.layers.Add()([shared(a), shared(b)]))
    names = [c.name for c in _capture(model).calls]
    assert names == ["shared", "shared#2", "add"]


def test_rnn_inner_cell_is_not_a_separate_leaf():
    names = [c.type for c in _capture(embedding_model()).calls]
    assert names == ["Embedding", "LSTM", "Dense"]


def test_op_devices_are_recorded_and_host_fallback_detected():
    from keras_models import text_model
    from tbs.backends.tensorflow.discovery import discover
    from tbs.measure.rows import fallback_ops

    model = text_model()
    inputs = structure_inputs(model, synthetic_batch(input_specs(model), 2))
    calls = capture(model, inputs, training=False, device=discover().devices[0], record_devices=True).calls
    vectorize = calls[0]
    assert any("CPU" in d for devices in vectorize.op_devices.values() for d in devices)

    class Target:
        def __init__(self, kind):
            self.kind = kind

    assert fallback_ops(vectorize, Target("cpu")) == []
    fallen = fallback_ops(vectorize, Target("gpu"))  # the same placements seen from a GPU target
    assert fallen and all(isinstance(op, str) for op in fallen)


def test_pass_through_layers_keep_the_graph_intact():
    """Dropout returns its input object in inference; its consumers must still hang off it."""
    inp = keras.Input((4,), name="x")
    h = keras.layers.Dense(3, name="d1")(inp)
    drop = keras.layers.Dropout(0.5, name="drop")(h)
    side = keras.layers.Dense(2, name="side")(h)
    out = keras.layers.Concatenate(name="cat")([keras.layers.Dense(2, name="d2")(drop), side])
    edges = {(e.src, e.dst) for e in _capture(keras.Model(inp, out)).edges}
    assert ("d1", "drop") in edges and ("drop", "d2") in edges and ("d1", "side") in edges
    assert ("drop", "side") not in edges


def test_layers_that_do_nothing_in_the_mode_are_marked_inactive():
    """Dropout hands its input back in inference (its time is the harness's); in training it works."""
    inp = keras.Input((4,), name="x")
    h = keras.layers.Dense(3, name="d1")(inp)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    model = keras.Model(inp, keras.layers.Dense(2, name="d2")(h))
    inactive = {c.name: c.inactive for c in _capture(model).calls}
    assert inactive == {"d1": False, "drop": True, "d2": False}
    assert not any(c.inactive for c in _capture(model, training=True).calls)


def test_under_a_mixed_precision_policy_the_graph_records_the_real_input_and_activation_edges():
    """Keras casts a layer's inputs before the call: the first edge read '/input/?', bfloat16, half its size."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs = keras.Input((8,), name="x")
        logits = keras.layers.Dense(3, name="logits")(keras.layers.Dense(16, name="d")(inputs))
        model = keras.Model(inputs, keras.layers.Activation("softmax", name="probs", dtype="float32")(logits))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    cap = capture(model, np.ones((4, 8), "float32"), False)
    edges = {(e.src, e.dst): e for e in cap.edges}
    first = edges[("/input/x", "d")]  # float32 flows in; the layer casts it
    assert (first.dtype, first.bytes, first.inferred) == ("float32", 4 * 8 * 4, False)
    into_probs = edges[("logits", "probs")]  # bfloat16 logits; the float32 softmax casts them
    assert (into_probs.dtype, into_probs.bytes, into_probs.inferred) == ("bfloat16", 4 * 3 * 2, False)
    assert not any(e.inferred or e.src == "/input/?" for e in cap.edges)
    assert [c.sources for c in cap.calls] == [["/input/x"], ["d"], ["logits"]]
