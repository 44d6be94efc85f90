"""The Device interface every backend implements, and choosing devices from what was found.

Everything device-specific (where data lives, how a call is compiled and
repeated, how to wait for the device) sits behind Device, so a new backend or
device kind is one new class.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from tbs.errors import DeviceError, TbsError

_TOKEN = re.compile(r"^(cpu|gpu|tpu)(:\d+)?$")


Runner = Callable[[int], None]  # runner(n): n calls on the device, waited for


@dataclass
class TrainingPrograms:
    """One call's training phases compiled for a device, and the memory it holds for training.

    Every runner is timed with the same blocked, amortised harness as a forward pass.
    """

    forward: Runner  # the call with training=True; its state (BatchNorm statistics, dropout seeds) carried
    # Gradients w.r.t. the trainable variables and the inputs real training needs; None when
    # there is nothing to differentiate (no trainable variable at or before the call).
    backward: Runner | None
    # True where ``backward`` re-runs the forward pass too (TensorFlow: a gradient needs its
    # tape), so the backward's time is this runner's minus ``forward``'s.
    backward_includes_forward: bool
    update: Runner | None  # the optimizer's update of the call's trainable variables (slots included)
    weight_bytes: int  # every variable the call owns (a shared layer's are its first call's)
    slot_bytes: int  # the optimizer's variables for the call's trainable variables
    residual_bytes: int | None  # activations kept alive for the backward; None where the program does not say
    # The compiler's analysis of one call of each phase program (keys as the runners': forward,
    # backward or forward+backward, update); None where the backend cannot say.
    costs: Callable[[], dict[str, "ProgramCost"]] | None = None
    # True where each call of ``backward`` runs the forward once before its loop (TensorFlow: the
    # tape its gradients read): the profiler takes forward / iterations off each backward sample.
    backward_runs_forward_once: bool = False
    # The forward and backward in one program, as a train step runs them (TensorFlow, beside a
    # backward timed alone): the backward is bounded by it, since graph rewrites that need both
    # (oneDNN's pooling gradient reading its forward's workspace) reach only a backward beside its forward.
    forward_backward: Runner | None = None


@dataclass
class ProgramCost:
    """What the compiler says one program costs: FLOPs and bytes before and after optimisation, and its memory.

    Read from the exact program tbs times (XLA's HLO cost and memory analysis), so a user can
    see why a layer costs what it does and what fusion saved. None: the compiler did not say.
    """

    source: str  # how it was obtained: "xla", "xla (TensorFlow's HLO)", "tensorflow graph statistics"
    flops: float | None = None  # after optimisation
    bytes_accessed: float | None = None
    flops_unoptimized: float | None = None  # the HLO before XLA's passes (the paper's Fig. 2 "before")
    bytes_unoptimized: float | None = None
    transcendentals: float | None = None
    temp_bytes: int | None = None  # the compiled program's temporary buffers
    argument_bytes: int | None = None
    output_bytes: int | None = None
    reason: str = ""  # why some figure is missing
    # The optimised program's kernels as JSON (tbs.backends.hlo_kernels): what a GPU would launch for it.
    kernels: str | None = None


@dataclass
class TracedOp:
    """One op (an XLA kernel or thunk, a TensorFlow op) of a traced whole-model call, as the framework's profiler saw it.

    ``parts`` say whose work it is: each framework op path it runs (an XLA fusion runs several, each
    carrying the Keras layer's name scope in its ``op_name``) with its weight, the FLOPs it
    does (one per output element where it is elementwise): what a fused kernel's time is split by.
    """

    call: int  # which traced call (0, 1, ...)
    name: str  # the kernel or op as the profiler names it
    start_s: float  # from the start of the trace
    duration_s: float
    parts: list[tuple[str, float]]  # (framework op path, weight); empty where the op names no path


@dataclass
class TracedCalls:
    """A few whole-model calls traced with the framework's own profiler, after the model's timed samples."""

    calls: list[tuple[float, float]]  # each call's (start_s, duration_s): its first op's start to its last op's end
    ops: list[TracedOp]
    tool: str  # which profiler: "jax.profiler (XLA:CPU thunks)", "tf.profiler (TensorFlow ops)"


# Square matmul side and streamed bytes per device kind: long enough to reach the ceiling, short to time.
CALIBRATION_MATMUL_N = {"cpu": 1024, "gpu": 8192, "tpu": 8192}
CALIBRATION_STREAM_BYTES = {"cpu": 256 * 2**20, "gpu": 2 * 2**30, "tpu": 2 * 2**30}


@dataclass
class CalibrationProgram:
    """A program whose work is known exactly: timing it gives the device's achievable ceiling."""

    name: str  # "matmul" | "stream"
    dtype: str
    runner: "Runner"
    flops: float
    bytes: float


Source = tuple[str, int]  # where a tensor comes from: (endpoints.GRAPH_INPUT, i) for model input i, or (call name, output index)


@dataclass
class PlacedStep:
    """One layer call of a split train step: the call (on its device's model copy), where it runs, what feeds it."""

    name: str
    call: Any  # a recorded LayerCall of the model copy on ``device``
    device: "Device"
    sources: list[Source | None]  # per flat tensor argument; None: a constant of the call
    grad_inputs: list[bool]  # per flat tensor argument: does the backward compute its gradient


class Device(ABC):
    """One place a layer can run."""

    backend: str = ""  # set by each backend's Device
    backward_method: str = ""  # how a training profile's backward phase is timed on this backend
    # Memory a whole train step takes while it runs, per byte of its calls' tensors (inputs and
    # outputs): how much of a training group fits at once. Conservative unless measured.
    train_step_memory_factor: float = 4.0

    def __init__(self, kind: str, index: int, description: str = "", memory_bytes: int | None = None) -> None:
        self.kind = kind  # "cpu" | "gpu" | "tpu"
        self.index = index
        self.name = f"{kind}:{index}"  # e.g. "cpu:0", "gpu:1"
        self.description = description
        self.memory_bytes = memory_bytes

    @abstractmethod
    def scope(self) -> AbstractContextManager:
        """Context in which new variables and ops land on this device."""

    @abstractmethod
    def place(self, structure: Any) -> Any:
        """Copy every array/tensor in ``structure`` onto this device."""

    def fit_model(self, model: Any) -> Any:
        """Make this device's own copy of the model run as it would on this device alone (returns it).

        Nothing to do by default; a backend whose layers choose their kernels by what the process has,
        not by the device they are traced for, sets them here.
        """
        return model

    @abstractmethod
    def compile_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                        variables: Sequence[Any] = (), outputs_written: bool = False) -> Callable[[int], None]:
        """A compiled runner: ``runner(n)`` calls ``call(*tensors)`` n times on the device and waits for it.

        ``variables`` are the Keras variables ``call`` reads: a backend that compiles
        pure functions (JAX) passes their values in as arguments. ``outputs_written``: the
        call's outputs are written out, as a call that returns them writes them, before
        the loop consumes them (the whole model: its program must be the one a user runs).
        """

    def overlapped_blocked(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                           variables: Sequence[Any] = ()) -> Callable[[int], None] | None:
        """Like ``compile_blocked``, but calls that do not depend on each other may overlap.

        What back-to-back calls achieve (throughput) where a backend's loop runs several
        iterations at once; None where it runs them one after another (nothing to add).
        """
        return None

    @abstractmethod
    def sync(self) -> None:
        """Wait until all work queued on this device has finished."""

    def run_placed(self, call: Any, args: tuple, kwargs: dict) -> Any:
        """Run one recorded layer call here, inside a replayed forward pass (verifying a placement): what the
        default ``run_segment`` runs each call with. A backend that compiles a whole run (JAX) needs none."""
        raise NotImplementedError(f"{type(self).__name__} replays a placement through run_segment")

    def run_segment(self, key: Hashable, calls: list[Any], run: Callable[..., list[Any]],
                    tensors: list[Any]) -> list[Any]:
        """Run consecutive placed calls here, inside a replayed forward pass: ``run(*tensors, invoke=...)`` calls
        ``invoke(call, args, kwargs)`` for each. One call at a time by default (``run_placed``), which is one
        program already where the replay is one graph (TensorFlow); ``key`` names the run for a backend that
        compiles it once."""
        return run(*tensors, invoke=self.run_placed)

    @abstractmethod
    def replay_runner(self, replay: Callable[..., Any], tensors: list[Any]) -> Callable[[int], None]:
        """``runner(n)``: run a replayed forward pass n times, one after another, and wait for it."""

    @abstractmethod
    def ran_here(self, call: Any) -> bool:
        """Whether the call's work, as captured on this device, really stayed on it."""

    def harness(self, xla: bool) -> Callable[[int], None]:
        """An empty compiled loop on this device: what the timing harness itself costs."""
        return self.compile_blocked(lambda x: x, [self.place(np.ones((), np.float32))], xla)

    def training_programs(self, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any],
                          grad_inputs: Sequence[bool], make_optimizer: Callable[[], Any] | None,
                          xla: bool, seed: int = 0, owned: Sequence[bool] | None = None) -> TrainingPrograms:
        """Compile ``call(*tensors)``'s forward, backward and update programs (training profiles).

        ``variables`` are every Keras variable the call reads; its trainable ones are
        differentiated and updated. ``grad_inputs[i]`` says whether the gradient w.r.t.
        ``tensors[i]`` is needed. Cotangents are random normal values (from ``seed``) shaped
        like each floating output; ``make_optimizer()`` gives a fresh, unbuilt optimizer.
        ``owned[j]`` is False for a variable an earlier call of a shared layer holds: a real
        step computes its gradient here too, but updates it (and keeps it and its optimizer
        slots in memory) once, with that call; None: the call owns every variable.
        """
        raise NotImplementedError(f"{self.backend or type(self).__name__} cannot time training phases")

    def loss_reads_logits(self, loss: Callable[[list[Any], Any], Any], targets: list[Any],
                          outputs: list[Any]) -> list[bool]:
        """Per model output: does ``loss`` read the logits its activation kept, never the activation's output?

        Keras's TensorFlow backend does (a softmax or sigmoid output keeps its logits, and the
        cross-entropies read them), so a compiled train step never runs that activation.
        """
        return [False] * len(outputs)

    def train_step(self, model: Any, tensors: list[Any], rebuild: Callable[[list[Any]], Any],
                   targets: list[Any], loss: Callable[[list[Any], Any], Any],
                   make_optimizer: Callable[[], Any], xla: bool) -> Runner:
        """A runner of whole compiled train steps: forward (training=True), ``loss(targets, outputs)``,
        gradients of every trainable variable, and the optimizer's update; state carried between steps."""
        raise NotImplementedError(f"{self.backend or type(self).__name__} cannot time a train step")

    def split_train_runner(self, steps: list[PlacedStep], outputs: list[Source], inputs: list[Any],
                           targets: list[Any], loss: Callable[[list[Any], Any], Any], loss_device: "Device",
                           make_optimizer: Callable[[], Any]) -> Runner:
        """``runner(n)``: n train steps of a placement, run for real, one after another.

        Each call's forward, backward and update run on its step's device (its weights
        live there); activations move forward and gradients move back between devices;
        the loss runs on ``loss_device``. Called on the host device, which feeds the inputs.
        """
        raise NotImplementedError(f"{self.backend or type(self).__name__} cannot replay a split train step")

    def program_cost(self, call: Callable[..., Any], tensors: list[Any], xla: bool,
                     variables: Sequence[Any] = ()) -> ProgramCost:
        """The compiler's cost and memory analysis of ``call(*tensors)`` compiled for this device (one call)."""
        raise NotImplementedError(f"{self.backend or type(self).__name__} has no cost analysis")

    def calibration_programs(self, dtype: str) -> list[CalibrationProgram]:
        """A large matmul and a large streaming read in ``dtype``, compiled here, with their exact work."""
        raise NotImplementedError(f"{self.backend or type(self).__name__} cannot calibrate")

    def memory_estimate_note(self, xla: bool) -> str:
        """Why a batch limit from XLA's compiled memory may be too high on this backend ('' if it holds)."""
        return ""

    def peak_memory_bytes(self, reset: bool = False) -> int | None:
        """The device's peak-memory counter (None where it keeps none).

        ``reset=True`` restarts it where the device allows and returns what is in use now (the
        baseline); ``reset=False`` returns the peak since then.
        """
        return None

    def compiled_outputs(self, call: Callable[..., list[Any]], tensors: list[Any],
                         variables: Sequence[Any] = ()) -> list[Any] | None:
        """``call(*tensors)`` run once here as one compiled program, its flat outputs; None where
        this backend cannot (then a batch too large for one eager capture is not measured).

        A compiled program frees each intermediate once its last reader has run and computes only
        what its outputs need, where an eager pass of a Functional model keeps every activation.
        """
        return None

    def trace_calls(self, call: Callable[..., Any], tensors: list[Any], xla: bool, variables: Sequence[Any] = (),
                    calls: int = 3) -> TracedCalls | None:
        """``call(*tensors)`` compiled as one program, warmed up, then ``calls`` calls traced with the framework's
        profiler: each op with the framework op paths (Keras name scopes) it runs. None where this backend
        cannot trace (then a profile has no in-context times)."""
        return None

    def trace(self, call: Callable[..., Any], tensors: list[Any], variables: Sequence[Any] = ()) -> bool:
        """Trace ``call`` on the shapes of ``tensors`` (stand-ins from ``abstract``) without running it
        or allocating its data; False where this backend cannot."""
        return False

    def abstract(self, x: Any) -> Any:
        """A shape-and-dtype stand-in for tensor ``x``: ``trace`` and ``program_cost`` take it in place
        of the data, so a batch too large to hold still gets the compiler's analysis."""
        return x

    def capture_context(self) -> AbstractContextManager:
        """Context for the eager capture pass on this device (a backend may relax Keras's input checks)."""
        return nullcontext()

    def watch_ops(self) -> AbstractContextManager[dict[str, set[str]]]:
        """Context recording, per op type, where the eager ops inside it ran (empty where not observable)."""
        return nullcontext({})

    def unsupported_reason(self, tensors: Sequence[Any]) -> str | None:
        """Why a call reading or writing these tensors cannot run on this device (None: it can)."""
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "memory_bytes": self.memory_bytes,
            "backend": self.backend,
        }


@dataclass
class Discovery:
    """Devices found, and for each kind with none, why."""

    devices: list[Device]
    missing: dict[str, str] = field(default_factory=dict)


def parse_device_tokens(text: str) -> list[str]:
    """'cpu,gpu:1' -> ['cpu', 'gpu:1']; raises TbsError naming any unknown device."""
    tokens = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not tokens:
        raise TbsError("--devices: no device given; write e.g. --devices cpu,gpu")
    for token in tokens:
        if not _TOKEN.match(token):
            raise TbsError(
                f"--devices: unknown device '{token}'; choose from cpu, gpu, tpu or one device such as gpu:0"
            )
    return list(dict.fromkeys(tokens))


def select(discovery: Discovery, requested: list[str] | None, warn: Callable[[str], None]) -> list[Device]:
    """The devices to profile: all found, or those requested; missing ones are skipped with their reason."""
    if not requested:
        chosen = list(discovery.devices)
    else:
        chosen = []
        for token in requested:
            if ":" in token:
                matches = [d for d in discovery.devices if d.name == token]
            else:
                matches = [d for d in discovery.devices if d.kind == token]
            if not matches:
                kind = token.split(":")[0]
                found = ", ".join(d.name for d in discovery.devices if d.kind == kind)
                reason = discovery.missing.get(kind) or (f"only {found} found" if found else "not found")
                warn(f"skipping {token}: {reason}")
            for device in matches:
                if device not in chosen:
                    chosen.append(device)
    if not chosen:
        available = ", ".join(d.name for d in discovery.devices) or "none"
        raise DeviceError(f"none of the requested devices ({', '.join(requested or [])}) is available; found: {available}")
    return chosen
