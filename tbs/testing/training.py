"""Fake training profiles, written through the real ProfileStore: no framework is imported.

``fake_training_profile`` scripts each layer's forward, backward and update per device
and batch (and the loss, and the whole step), so the training report, the inference
against training comparison and training placement are tested in milliseconds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tbs.backends.base import Device
from tbs.cost.reprice import row_pricer
from tbs.measure.transfers import pair_key
from tbs.profiles.profile import Profile
from tbs.profiles.store import ProfileStore, finalize
from tbs.endpoints import GRAPH_OUTPUT
from tbs.schema import FORMAT_VERSION, LOSS_LAYER, MODEL_LAYER, SYNTHETIC_INPUT, CellKey, Status
from tbs.testing.fakes import INPUT_WIDTH, FakeClock, FakeDevice, FakeLayer, FakeModel, fake_capture

Seconds = float | Callable[[int], float] | None  # None: the phase failed (a blank cell, never 0)
PhaseScript = Mapping[str, tuple[Seconds, Seconds, Seconds]]  # layer -> (forward, backward, update) per call
FAKE_LOSS = "SparseCategoricalCrossentropy"
RESIDUAL_UNKNOWN = ((LOSS_LAYER, "cpu:0"), (LOSS_LAYER, "gpu:0"), ("pool", "gpu:0"))  # blank residual_bytes
SPREAD = (0.96, 0.98, 1.0, 1.02, 1.04)  # each phase's samples around its scripted value: median exact
# A text model whose cheapest device changes from inference to training: the CPU wins the
# embedding's forward, the GPU its backward and update.
TRAINING_SECONDS: dict[str, PhaseScript] = {
    "cpu:0": {"vectorize": (2e-4, 0.0, 0.0), "embedding": (lambda b: 2e-6 * b, lambda b: 2e-5 * b, 4e-4),
              "pool": (lambda b: 1e-6 * b, lambda b: 2e-6 * b, 0.0),
              "dense": (lambda b: 4e-6 * b, lambda b: 8e-6 * b, 1e-5),
              "head": (lambda b: 1e-6 * b, lambda b: 2e-6 * b, 2e-6), LOSS_LAYER: (lambda b: 5e-7 * b, 5e-6, 0.0)},
    "gpu:0": {"vectorize": (2e-3, 0.0, 0.0), "embedding": (3e-5, lambda b: 3e-5 + 1e-7 * b, 3e-5),
              "pool": (2e-5, 2e-5, 0.0), "dense": (2e-5, 3e-5, 2e-5), "head": (2e-5, 2e-5, 2e-5),
              LOSS_LAYER: (1e-5, 1e-5, 0.0)},
}


def training_model() -> FakeModel:
    """TextVectorization -> Embedding -> pooling -> Dense -> Dense: each kind of training row once."""
    return FakeModel([FakeLayer("vectorize", layer_type="TextVectorization", category="preprocessing"),
                      FakeLayer("embedding", layer_type="Embedding", category="embedding", params=1600),
                      FakeLayer("pool", layer_type="GlobalAveragePooling1D", category="pooling"),
                      FakeLayer("dense", layer_type="Dense", category="dense", params=20),
                      FakeLayer("head", layer_type="Dense", category="dense", params=5)], name="fake_text")


def _seconds(value: Seconds, batch: int) -> float:
    return math.nan if value is None else float(value(batch) if callable(value) else value)


def _needs_grad(model: FakeModel) -> dict[str, bool]:
    """Per layer: does training need the gradient of its output (it, or a layer before it, is trainable)."""
    needs: dict[str, bool] = {}
    for layer in model.layers:
        needs[layer.name] = layer.params > 0 or any(needs.get(src, False) for src in model.inputs_of[layer.name])
    return needs


def _phase_rows(base: dict[str, Any], phases: tuple[Seconds, Seconds, Seconds], names: str,
                memory: tuple[int, int, int | None]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One training summary row (phases summed, as the schema says) and its samples, one per phase and spread."""
    batch = base["batch_size"]
    values = [_seconds(p, batch) for p in phases]
    failed = [n for n, v in zip(("forward", "backward", "update"), values) if math.isnan(v)]
    median = sum(values)
    row = dict(base, status=Status.ERROR.value if failed else Status.OK.value, n=len(SPREAD), iterations=10,
               reason=f"{', '.join(failed)} failed: RuntimeError: scripted" if failed else "",
               median_s=median, p25_s=median * SPREAD[1], p75_s=median * SPREAD[3], ci_low_s=median * SPREAD[0],
               ci_high_s=median * SPREAD[-1], per_sample_s=median / batch, first_call_s=0.05, phases=names,
               forward_s=values[0], backward_s=values[1], update_s=values[2], weight_bytes=memory[0],
               slot_bytes=memory[1], residual_bytes=memory[2])
    samples = [{"target": "layer", "layer": base["layer"], "device": base["device"], "batch_size": batch,
                "mode": base["mode"], "sample": i, "iterations": 10, "raw_seconds": 10 * v * f, "harness_call_s": 0.0,
                "harness_iteration_s": 0.0, "seconds_per_call": v * f, "host": base["host"], "phase": phase}
               for phase, v in zip(("forward", "backward", "update"), values) if phase in names and not math.isnan(v)
               for i, f in enumerate(SPREAD)]
    return row, samples


def _training_layers(model: FakeModel, batch: int, training: bool) -> tuple[list[dict[str, Any]], list[dict]]:
    """metadata.json's layers and graph at one batch size (with the loss, gradients and trainability in training)."""
    capture = fake_capture(model, np.zeros((batch, INPUT_WIDTH), np.float32), training)
    needs = _needs_grad(model)
    layers = [c.replace(batch_size=batch).as_dict() for c in capture.calls]
    edges = [vars(e) for e in capture.edges]
    if not training:
        return layers, edges
    for layer in layers:
        layer.update(trainable=layer["params"] > 0,
                     grad_inputs=[needs.get(src, False) for src in model.inputs_of[layer["name"]]])
    last = dict(edges[-1], dst=LOSS_LAYER)
    edges = [dict(e, grad=needs.get(e["src"], False) and e["dst"] != GRAPH_OUTPUT) for e in edges]
    edges.append(dict(last, grad=True))
    layers.append({"name": LOSS_LAYER, "type": FAKE_LOSS, "category": "loss", "params": 0, "batch_size": batch,
                   "input_bytes": last["bytes"], "trainable": False, "grad_inputs": [True, False]})
    return layers, edges


def _phases_of(layer: dict[str, Any], training: bool) -> str:
    if not training:
        return ""
    if layer.get("trainable"):
        return "forward+backward+update"
    return "forward+backward" if any(layer.get("grad_inputs", [])) else "forward"


def fake_training_profile(directory: str | Path, model: FakeModel | None = None,
                          seconds: Mapping[str, PhaseScript] | None = None, batch_sizes: Sequence[int] = (8, 64), *,
                          prices: Mapping[str, float] | None = None, training: bool = True,
                          residual_unknown: Sequence[tuple[str, str]] = RESIDUAL_UNKNOWN,
                          transfer_fit: tuple[float, float] = (1e-5, 1e-10), step_factor: float = 0.9) -> Profile:
    """A training profile (or, ``training=False``, the inference profile of the same script), written and finalized.

    Rows, samples and metadata follow ``tbs.schema`` exactly as a training run writes them:
    a row per layer x device x batch with its three phases, a loss row, a whole train step
    per device x batch (``step_factor`` x the sum of its rows), the layer graph with its
    gradients, transfer fits and prices (default cpu 0.5, gpu 3 USD/h). Layers without a
    script on a device are left out; ``residual_unknown`` (layer, device) pairs get a blank
    residual_bytes. Inference keeps only the forward phase. Nothing is timed.
    """
    model, seconds = model or training_model(), seconds or TRAINING_SECONDS
    prices = {"cpu": 0.5, "gpu": 3.0} if prices is None else prices
    mode, price_row = ("training" if training else "inference"), row_pricer(prices)
    clock = FakeClock()
    devices = [FakeDevice(name.split(":")[0], int(name.split(":")[1]), clock, {}) for name in seconds]
    store = ProfileStore(Path(directory))
    fit = {"alpha_s": transfer_fit[0], "beta_s_per_byte": transfer_fit[1]}
    store.create({"tbs_profile_version": FORMAT_VERSION, "model": {"name": model.name, "sha256": f"fake-{model.name}",
                  "class": "FakeModel", "params": sum(l.params for l in model.layers)}, "mode": mode,
                  "batch_sizes": list(batch_sizes), "devices": [d.as_dict() for d in devices], "backend": "fake",
                  "host": {"hostname": "fakehost"}, "input_source": f"{SYNTHETIC_INPUT} (seed 0)",
                  "prices_usd_per_hour": dict(prices), "host_device": devices[0].name,
                  "transfers": {pair_key(a.name, b.name): fit for a in devices for b in devices if a is not b}})
    if training:
        store.update_metadata(training={
            "loss": {"name": FAKE_LOSS, "source": "model.compile"},
            "optimizer": {"name": "Adam", "config": {"learning_rate": 0.001}, "source": "model.compile"},
            "backward_method": "scripted (tbs.testing)", "targets": f"{SYNTHETIC_INPUT} (seed 0)"})
    graph = {}
    for batch in batch_sizes:
        layers, graph[str(batch)] = _training_layers(model, batch, training)
        for device in devices:
            _write_device(store, device, batch, layers, seconds[device.name], mode, price_row, residual_unknown,
                          step_factor)
    store.update_metadata(layers=layers, graph=graph)
    return finalize(store)


def _write_device(store: ProfileStore, device: Device, batch: int, layers: list[dict[str, Any]],
                  script: PhaseScript, mode: str, price_row: Callable, residual_unknown: Sequence[tuple[str, str]],
                  step_factor: float) -> None:
    """One device's rows at one batch: every scripted layer, then its whole (train) step."""
    base = {"device": device.name, "device_kind": device.kind, "batch_size": batch, "mode": mode, "host": "fakehost"}
    total = 0.0
    for layer in layers:
        if layer["name"] not in script:
            continue
        phases = _phases_of(layer, mode == "training")
        forward, backward, update = script[layer["name"]]
        timed = (forward, backward, update) if phases else (forward, 0.0, 0.0)
        params = 4 * int(layer.get("params") or 0)
        residual = None if (layer["name"], device.name) in residual_unknown else (
            int(layer.get("input_bytes") or 0) if "backward" in phases else 0)
        memory = (params, 2 * params if layer.get("trainable") else 0, residual)
        row, samples = _phase_rows(dict(base, layer=layer["name"], layer_type=layer["type"],
                                        category=layer["category"]), timed, phases or "forward", memory)
        if not phases:  # inference: the forward pass only, phase columns blank
            row.update(phases=None, forward_s=None, backward_s=None, update_s=None, weight_bytes=None,
                       slot_bytes=None, residual_bytes=None)
        total += row["median_s"]
        store.add_cell(CellKey.of("layer", layer["name"], device.name, batch, mode), price_row(row), samples)
    whole = step_factor * total
    step = dict(base, status=Status.OK.value if math.isfinite(whole) else Status.ERROR.value, n=len(SPREAD),
                iterations=10, median_s=whole, p25_s=whole * SPREAD[1], p75_s=whole * SPREAD[3],
                ci_low_s=whole * SPREAD[0], ci_high_s=whole * SPREAD[-1], per_sample_s=whole / batch,
                dispatch_overhead_s=1e-5, input_copy_s=2e-6, input_bytes=batch * INPUT_WIDTH * 4, first_call_s=0.5)
    store.add_cell(CellKey.of("model", MODEL_LAYER, device.name, batch, mode), price_row(step), [])
