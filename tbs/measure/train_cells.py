"""Training cells: which gradients a real backward computes, each cell's phase programs, and their rows.

A training profile times, per leaf layer, three programs with the forward pass's
harness -- forward (``training=True``), backward, the optimizer's update -- plus the
loss (its value and its gradient) as a row of its own, and one whole compiled train
step per device and batch to check the per-layer sum against.

Which gradients a backward computes follows what real training needs: a layer's
trainable variables, and an input's gradient only when that input is floating point
and produced by a layer that is trainable or has a trainable layer before it. A layer
with neither (preprocessing in front of the first trainable layer) has no backward;
asking for more gradients than a real step computes would inflate the sum.

A shared layer (one layer called twice, as in a siamese network) computes its weights'
gradients in each call's backward, but a real step updates each variable once: its
update, its weights and its optimizer slots belong to the first call that uses it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from tbs.backends.base import Device, TrainingPrograms
from tbs.backends.tensors import dtype_name, iter_tensors
from tbs.capture.recorder import Capture, LayerCall
from tbs.load.train_setup import TrainingSetup
from tbs.measure import analysis, rows
from tbs.measure.dedupe import call_signature
from tbs.measure.inference import invoker
from tbs.measure.skipped import SkippedActivation, skipped_activations, without_activation
from tbs.measure.stats import Summary
from tbs.measure.timing import Measurement, Runner
from tbs.endpoints import GRAPH_OUTPUT
from tbs.schema import LOSS_LAYER, LayerRecord, Phase, Status

FORWARD, BACKWARD, FORWARD_BACKWARD = Phase.FORWARD.value, Phase.BACKWARD.value, Phase.FORWARD_BACKWARD.value
UPDATE, STEP = Phase.UPDATE.value, Phase.STEP.value
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def is_trainable(op: Any) -> bool:
    return any(getattr(v, "trainable", False) for v in getattr(op, "trainable_variables", None) or ())


def gradient_plan(calls: list[LayerCall]) -> dict[str, list[bool]]:
    """For each call, per flat input: does a real backward compute that input's gradient?"""
    reaching: set[str] = set()  # calls whose output carries a gradient back to some trainable variable
    plan: dict[str, list[bool]] = {}
    for call in calls:
        dtypes = [dtype_name(x) for x in iter_tensors((call.args, call.kwargs))]
        wanted = [src in reaching and dtype in FLOAT_DTYPES for src, dtype in zip(call.sources, dtypes)]
        plan[call.name] = wanted
        if is_trainable(call.op) or any(wanted):
            reaching.add(call.name)
    return plan


def variable_owners(calls: list[LayerCall]) -> tuple[dict[str, list[bool]], dict[str, str]]:
    """Per call, per variable of its layer: is it the first call to use it (its update and memory are this call's)?

    Also, for each later call of a shared layer that owns none of its variables, the call that does.
    """
    first: dict[int, str] = {}
    owned: dict[str, list[bool]] = {}
    weights_of: dict[str, str] = {}
    for call in calls:
        variables = list(getattr(call.op, "variables", None) or ())
        owned[call.name] = [first.setdefault(id(v), call.name) == call.name for v in variables]
        if variables and not any(owned[call.name]):
            weights_of[call.name] = first[id(variables[0])]
    return owned, weights_of


def structure(cap: Capture, plan: dict[str, list[bool]],
              setup: TrainingSetup) -> tuple[dict[str, dict[str, Any]], LayerRecord, list[dict]]:
    """What training adds to each layer's record (trainable, grad_inputs and, for a shared layer's later
    calls, ``weights_of``); the loss's own record; the graph's edges with ``grad``, loss edges added."""
    _, weights_of = variable_owners(cap.calls)
    changes = {c.name: {"trainable": is_trainable(c.op), "grad_inputs": plan[c.name],
                        **({"weights_of": weights_of[c.name]} if c.name in weights_of else {})} for c in cap.calls}
    flows = {(c.name, src) for c in cap.calls for src, wanted in zip(c.sources, plan[c.name]) if wanted}
    edges = []
    for edge in cap.edges:
        entry = dict(vars(edge), grad=(edge.dst, edge.src) in flows)
        edges.append(entry)
        if edge.dst == GRAPH_OUTPUT:
            edges.append(dict(vars(edge), dst=LOSS_LAYER, grad=edge.dtype in FLOAT_DTYPES))
    loss = LayerRecord(name=LOSS_LAYER, type=setup.loss_name, category="loss", trainable=False, grad_inputs=[])
    return changes, loss, edges


def _interval(parts: list[Summary]) -> dict[str, float]:
    """A sum of independently measured programs: its median and bounds are the sums of theirs."""
    return {"median_s": sum(s.median_s for s in parts), "p25_s": sum(s.p25_s for s in parts),
            "p75_s": sum(s.p75_s for s in parts), "ci_low_s": sum(s.ci_low_s for s in parts),
            "ci_high_s": sum(s.ci_high_s for s in parts)}


def _shifted(summary: Summary, seconds: float) -> Summary:
    """The summary moved by ``seconds`` (never below 0): a fixed cost known to be in every sample, taken off."""
    return replace(summary, **{k: max(getattr(summary, k) + seconds, 0.0)
                               for k in ("median_s", "p25_s", "p75_s", "ci_low_s", "ci_high_s")})


def bounded_backward_s(forward: Summary, alone: Summary, both: Summary, iterations: int) -> float:
    """The backward timed alone (its one tape forward spread out), kept between what forward+backward allow.

    Timed beside its forward, the backward is at least forward+backward less the forward (less
    only where the two overlap on a second core) and at most forward+backward: above that, the
    lone program missed a rewrite the step gets (oneDNN's max-pool gradient from its forward's
    workspace: cnn_flowers' pooling backward read 26 ms alone against 4 ms with its forward).
    """
    alone_s = alone.median_s - forward.median_s / iterations
    return min(max(alone_s, both.median_s - forward.median_s, 0.0), both.median_s)


def training_row(base: dict[str, Any], parts: dict[str, Measurement], programs: TrainingPrograms,
                 grad_inputs: int, confidence: float) -> dict[str, Any]:
    """One layer's (or the loss's) row: its phases, their total as median_s, and its training memory."""
    s = {phase: m.summary(confidence) for phase, m in parts.items()}
    forward = s[FORWARD]
    update_s = s[UPDATE].median_s if UPDATE in s else 0.0
    if FORWARD_BACKWARD in s and BACKWARD in s:  # TensorFlow: the backward alone, bounded by forward+backward
        backward_s = bounded_backward_s(s[FORWARD], s[BACKWARD], s[FORWARD_BACKWARD], parts[BACKWARD].iterations)
        total = _interval([forward, s[BACKWARD]] + ([s[UPDATE]] if UPDATE in s else []))
        shift = forward.median_s + backward_s + update_s - total["median_s"]
        total = {k: max(v + shift, 0.0) for k, v in total.items()}
    elif FORWARD_BACKWARD in s:  # TensorFlow with --xla: backward = (forward + backward) - forward, never below 0
        both = s[FORWARD_BACKWARD]
        backward_s = max(both.median_s - forward.median_s, 0.0)
        total = _interval([both] + ([s[UPDATE]] if UPDATE in s else []))
        # The total is forward + backward + update exactly; the bounds move with it where backward was clipped.
        shift = forward.median_s + backward_s + update_s - total["median_s"]
        total = {k: v + shift for k, v in total.items()}
    else:
        backward = s.get(BACKWARD)
        if backward is not None and programs.backward_runs_forward_once:  # its one forward per sample, spread
            backward = _shifted(backward, -forward.median_s / parts[BACKWARD].iterations)
        backward_s = backward.median_s if backward is not None else 0.0
        total = _interval([forward] + [x for x in (backward, s.get(UPDATE)) if x is not None])
    phases = [FORWARD] + (["backward"] if programs.backward is not None else []) + ([UPDATE] if UPDATE in s else [])
    noisy = [p for p, m in parts.items() if m.status != Status.OK.value]
    notes = "; ".join(f"{p}: {parts[p].note or rows.NOISY_REASON}" for p in noisy)
    batch = base["batch_size"]
    return dict(base, **total, n=min(m.n for m in s.values()), iterations=parts[FORWARD].iterations,
                per_sample_s=total["median_s"] / batch,
                first_call_s=sum(m.first_call_seconds for m in parts.values()),
                status=Status.NOISY.value if noisy else Status.OK.value, reason=notes,
                phases="+".join(phases), forward_s=forward.median_s, backward_s=backward_s, update_s=update_s,
                weight_bytes=programs.weight_bytes, slot_bytes=programs.slot_bytes,
                # No backward keeps nothing alive (0, not unknown); blank where the program does not say.
                residual_bytes=0 if programs.backward is None else programs.residual_bytes, grad_inputs=grad_inputs)


def phase_runners(programs: TrainingPrograms) -> dict[str, Runner]:
    runners = {FORWARD: programs.forward}
    if programs.backward is not None:
        runners[FORWARD_BACKWARD if programs.backward_includes_forward else BACKWARD] = programs.backward
    if programs.forward_backward is not None:
        runners[FORWARD_BACKWARD] = programs.forward_backward
    if programs.update is not None:
        runners[UPDATE] = programs.update
    return runners


class TrainingCells:
    """The training cells of one (device, batch): every layer, the loss, and the whole train step."""

    def __init__(self, device: Device, setup: TrainingSetup, cap: Capture, inputs: Any, model: Any,
                 xla: bool, seed: int, confidence: float, tensors_fn: Callable[[Any], list[Any]],
                 rebuild_fn: Callable[[Any, list[Any]], Any]) -> None:
        self.device, self.setup, self.cap, self.inputs, self.model = device, setup, cap, inputs, model
        self.xla, self.seed, self.confidence = xla, seed, confidence
        self.tensors_fn, self.rebuild_fn = tensors_fn, rebuild_fn
        self.plan = gradient_plan(cap.calls)
        self.owned, _ = variable_owners(cap.calls)
        self.outputs = tensors_fn(cap.outputs)
        self.targets = device.place(setup.targets(self.outputs, int(np.shape(self.outputs[0])[0]), seed))
        # Output activations the step never runs (the loss reads their logits): timed apart, never summed.
        self.skipped = skipped_activations(cap, device, setup, list(self.targets), tensors_fn)

    @property
    def split_activations(self) -> list[SkippedActivation]:
        """The skipped activations that get a row of their own (the rest are whole layers)."""
        return [s for s in self.skipped.values() if not s.whole_layer]

    def _cell(self, label: str, base: dict[str, Any], data: Any, compile: Callable[[], TrainingPrograms],
              grad_inputs: int, call: LayerCall | None, signature: tuple | None = None) -> rows.Cell:
        made: dict[str, TrainingPrograms] = {}

        def programs() -> dict[str, Runner]:
            made["programs"] = compile()
            return phase_runners(made["programs"])

        def build(parts: dict[str, Measurement]) -> dict[str, Any]:
            row = training_row(base, parts, made["programs"], grad_inputs, self.confidence)
            if call is None:
                return row
            row["activation_bytes"] = int(call.output_bytes)
            return rows.flag_fallback(row, call, self.device)

        def analyse() -> dict[str, Any]:
            costs = made["programs"].costs
            if costs is None:
                raise NotImplementedError(f"{self.device.backend} does not analyse training programs")
            return analysis.phase_costs(costs())

        return rows.Cell(label, base, data, programs, build, analyse=analyse, call=call, signature=signature)

    def layer(self, call: LayerCall, label: str, base: dict[str, Any]) -> rows.Cell:
        wanted, variables = self.plan[call.name], getattr(call.op, "variables", ())
        owned = self.owned[call.name]  # a shared layer's variables: updated (and held) by their first call only
        invoke, skip = invoker(call, self.rebuild_fn), self.skipped.get(call.name)
        if skip is not None and skip.whole_layer:  # the step runs none of it: its forward alone, not summed
            wanted, variables, owned, base = [False] * len(wanted), (), [], dict(base, in_step=False)
        else:
            base = dict(base, in_step=True)
            if skip is not None:  # timed up to its logits, as the step runs it
                invoke = without_activation(invoke, call.op)

        def compile() -> TrainingPrograms:
            return self.device.training_programs(invoke, self.tensors_fn((call.args, call.kwargs)), variables, wanted,
                                                 self.setup.make_optimizer if variables else None, self.xla, self.seed,
                                                 owned)

        # Its programs depend on the input gradients it computes, on what of it the step runs, and on
        # which variables it updates (a shared layer's later calls update none).
        signature = call_signature(call, self.device.name, "training",
                                   (tuple(wanted), base["in_step"], skip is not None, tuple(owned)))
        return self._cell(label, base, (call.args, call.kwargs, call.outputs), compile, sum(wanted), call, signature)

    def activation(self, skip: SkippedActivation, label: str, base: dict[str, Any]) -> rows.Cell:
        """A skipped activation's own row: its forward on the logits, shown and never summed."""

        def compile() -> TrainingPrograms:
            return self.device.training_programs(skip.activate, [skip.logits], (), [False], None, self.xla, self.seed)

        return self._cell(label, dict(base, in_step=False), [skip.logits], compile, 0, None)

    def loss(self, label: str, base: dict[str, Any]) -> rows.Cell:
        count, setup = len(self.targets), self.setup
        skipped = {s.output_index: s for s in self.skipped.values()}
        inputs = [skipped[i].logits if i in skipped else out for i, out in enumerate(self.outputs)]

        def value(*flat: Any) -> Any:  # from the logits where the step reads them
            outputs = [skipped[i].activate(x) if i in skipped else x for i, x in enumerate(flat[count:])]
            return setup.loss(list(flat[:count]), outputs)

        wanted = [False] * count + [True] * len(self.outputs)

        def compile() -> TrainingPrograms:
            return self.device.training_programs(value, list(self.targets) + inputs, (), wanted, None,
                                                 self.xla, self.seed)

        return self._cell(label, dict(base, in_step=True), inputs, compile, len(self.outputs), None)

    def step(self, label: str, base: dict[str, Any], copy_seconds: float, input_bytes: int) -> rows.Cell:
        inputs = self.inputs

        made: dict[str, Any] = {}

        def programs() -> dict[str, Runner]:
            made["runner"] = self.device.train_step(self.model, self.tensors_fn(inputs),
                                                    lambda flat: self.rebuild_fn(inputs, flat), list(self.targets),
                                                    self.setup.loss, self.setup.make_optimizer, self.xla)
            return {STEP: made["runner"]}

        def analyse() -> dict[str, Any]:
            costs = getattr(made["runner"], "costs", None)
            if costs is None:
                raise NotImplementedError(f"{self.device.backend} does not analyse a train step")
            return costs()

        def build(parts: dict[str, Measurement]) -> dict[str, Any]:
            return rows.model_row(base, parts[STEP], copy_seconds, input_bytes, self.confidence)

        # The step reads and writes every variable and slot around its loop: a fixed cost per call
        # well above the empty harness's, amortised over more steps per sample.
        return rows.Cell(label, base, (inputs, self.cap.outputs), programs, build, target="model",
                         single_calls=rows.SINGLE_CALLS, analyse=analyse, amortise_fixed=True)



def memory_chunks(pending: dict[tuple, rows.Cell], cap: Capture, model_key: tuple, free_bytes: float | None,
                  step_factor: float = 4.0) -> tuple[list[dict[tuple, rows.Cell]], dict[tuple, float]]:
    """Split a group's cells so each chunk's programs fit in half the free memory together.

    A layer's training programs hold about three times its tensors (the residuals its
    backward keeps, a cotangent, the gradients); a whole train step ``step_factor`` times every
    call's tensors while it runs (the backend's ``Device.train_step_memory_factor``). The
    step goes in the first chunk. A cell that alone would need more than 80% of the free
    memory is returned apart with its estimate: it is recorded as out of memory, since the
    OS would kill the whole run. Without a figure for free memory everything is one chunk.
    """
    if free_bytes is None:
        return [dict(pending)], {}
    sizes = {c.name: 3 * (c.input_bytes + c.output_bytes) for c in cap.calls}
    tensors = sum(c.input_bytes + c.output_bytes for c in cap.calls)
    need = {key: (step_factor * tensors if key == model_key else sizes.get(key[1], 0)) for key in pending}
    too_big = {key: need[key] for key in pending if need[key] > 0.8 * free_bytes}
    chunks: list[dict[tuple, rows.Cell]] = [{}]
    used = 0.0
    for key in sorted(pending, key=lambda k: k != model_key):  # the step first
        if key in too_big:
            continue
        if chunks[-1] and used + need[key] > 0.5 * free_bytes:
            chunks.append({})
            used = 0.0
        chunks[-1][key] = pending[key]
        used += need[key]
    return chunks, too_big
