"""The profile format every stage shares: its version, cell statuses, cell keys, phases, metadata.

The measuring stage writes it and every later stage reads it, so it sits below
them all (beside ``errors`` and ``units``) rather than inside one stage, with its two
siblings: the CSV files' columns (``tbs.columns``) and the layer graph's endpoint names
(``tbs.endpoints``).

Format history (``FORMAT_VERSION``, written to ``metadata.json`` as ``tbs_profile_version``):
- 1: tbs 0.1 — summary.csv, model.csv, samples.csv, transfers.csv, metadata.json.
- 2: tbs 0.2 — same files and columns; the version is checked on load, ``tbs_version``
  records which tbs wrote the profile, and ``inactive`` marks layers that do nothing
  in the measured mode. Version 1 profiles read unchanged.
- 3: tbs 0.3 — training profiles: summary.csv gains ``phases``, ``forward_s``, ``backward_s``,
  ``update_s`` (``median_s`` is their sum), ``weight_bytes``, ``slot_bytes``, ``residual_bytes``
  and ``grad_inputs``; the loss is a row of its own (``LOSS_LAYER``); samples.csv gains
  ``phase``; graph edges say whether a gradient flows back along them (``grad``). Inference
  profiles are unchanged apart from ``phase`` = forward; versions 1 and 2 read unchanged.
- 4: tbs 0.4 — why a cell costs what it does: summary.csv and model.csv gain the compiler's
  ``flops``, ``bytes_accessed`` (after optimisation), ``activation_bytes`` (a layer's outputs;
  ``weight_bytes`` now in inference rows too), ``flops_unoptimized``,
  ``bytes_unoptimized``, ``transcendentals``, ``temp_bytes``, ``cost_source``, and the roofline
  columns derived from them and the device's calibrated ceilings (metadata ``calibration``);
  model.csv gains ``peak_bytes`` and ``memory_bytes``; ``analysis.csv`` holds each program's
  (phase's) analysis; ``predictions.csv`` holds cells predicted for devices not measured,
  kept apart from measured ones; metadata ``capacity`` gives each device's largest batch that
  fits. Older versions read unchanged (their analysis columns blank).
- 5: tbs 0.5 — every CSV value is checked on read (``tbs.columns.COLUMN_KINDS``); model.csv gains ``overlapped_s``
  (the whole model's calls back to back, free to overlap: throughput; samples of phase
  ``overlapped``); training rows gain ``in_step`` (False: a row the compiled train step never runs,
  an output activation whose logits the loss reads, shown and never summed) and TensorFlow's
  backward is timed alone (phase ``backward``, each sample after one forward). Older versions
  read unchanged. Added since, without a new version (a reader fills a missing column blank):
  analysis.csv's ``kernels`` (the optimised program's kernels, JSON) and predictions.csv's
  ``in_model_s`` and ``model_share`` (a layer's seconds and share inside a whole model predicted
  from its compiled program).
- 6: tbs 0.6 — the layer graph's endpoints are names no layer or input can take: a model input is
  ``/input/<its name>`` and the model's outputs go to ``/output`` (``tbs.endpoints.GRAPH_INPUT``, ``GRAPH_OUTPUT``),
  where versions 1-5 wrote ``input:<its name>`` and ``output``, which were compared with layer names:
  a layer named ``output`` was taken for the model's output, one named ``input_proj`` for a model
  input on the host. Older graphs read as if written so (``tbs.endpoints.current_graph``), and a resumed profile
  goes on in the new names.
- 7: tbs 0.7 (issue 32) — metadata.json's values are checked on read, not only its keys: every ``Metadata``
  field against its type, and the nested records against their own (``ModelRecord``,
  ``DeviceRecord``, ``TrainingRecord``, ``TransferFit``, ``CalibrationRecord``,
  ``CapacityRecord``); a damaged value is refused in one line naming the file and the key
  (``tbs.profiles.metadata.check_metadata``). The files and keys are those of version 6, so versions 1-6 read unchanged
  (they are checked the same way: a value of the wrong type was as damaged then).
- Added since 7, without a new version (a reader fills a missing column blank, never 0): in-context times.
  ``ops.csv`` holds each (device, batch)'s few whole-model calls traced with the framework's profiler
  (``tbs.columns.OPS_COLUMNS``: each call's span, each op with the framework op paths it runs); summary.csv gains
  ``in_model_s`` (a measured layer's seconds inside one traced whole-model call: the same meaning as
  predictions.csv's, measured here), ``model_share``, ``in_model_shared_s`` (the part of it from kernels
  shared with other layers) and ``in_model_note`` (why it differs from ``median_s``); model.csv gains
  ``in_model_s`` (the traced call's span), ``model_share`` (1), ``unowned_s`` (the framework's own time in it)
  and ``traced_calls``. All are derived from ops.csv when a profile is read (tbs.measure.in_context).
  metadata.json's ``transfers`` gain ``points`` (each timed copy size's median seconds), through which a copy
  is priced (beyond the smallest timed copy's time); a fit without them is priced through its raw samples in
  transfers.csv, else its line. metadata.json's ``kernel_rules`` says what analysis.csv's kernels' ``epilogue``
  flags mean (tbs.backends.hlo_kernels.KERNEL_RULES; absent: 1, a BatchNorm's scale folded into its convolution).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Mapping, NamedTuple, TypedDict

FORMAT_VERSION = 7
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
# The Keras backend a profile was measured on when its metadata does not say (profiles before
# the backend was recorded); ``tbs.backends.DEFAULT`` is this same name.
DEFAULT_BACKEND = "tensorflow"


class Status(str, Enum):
    """What became of one cell (a str, so it compares equal to the text in the CSV files)."""

    OK = "ok"
    NOISY = "noisy"  # measured, but its CI stayed wider than the target
    OOM = "oom"
    ERROR = "error"
    CPU_FALLBACK = "cpu-fallback"  # measured, but some ops ran on the host CPU
    UNSUPPORTED = "unsupported"  # this backend cannot run the call at all

    def __str__(self) -> str:
        return self.value


MEASURED = (Status.OK.value, Status.NOISY.value)  # a time that ran where it says
USABLE = MEASURED + (Status.CPU_FALLBACK.value,)  # a time worth drawing (fallback flagged)
FAILED = (Status.OOM.value, Status.ERROR.value)  # retried by --resume
NOT_MEASURED = FAILED + (Status.UNSUPPORTED.value,)


class ProfileStatus(str, Enum):
    """How far a profile got (``metadata.json``'s ``status``); a str, like ``Status``."""

    RUNNING = "running"
    INTERRUPTED = "interrupted"
    COMPLETE = "complete"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


class CellKey(NamedTuple):
    """One measured cell: a layer (or the whole model) on one device at one batch size."""

    target: str  # "layer" | "model"
    layer: str
    device: str
    batch_size: int
    mode: str

    @classmethod
    def of(cls, target: str, layer: str, device: str, batch_size: int, mode: str) -> "CellKey":
        return cls(target, layer, device, int(batch_size), mode)


MODEL_LAYER = "(model)"  # the layer column of whole-model samples
LOSS_LAYER = "(loss)"  # the layer column of a training profile's loss row (category "loss")


class Phase(str, Enum):
    """Which program a sample timed (samples.csv's ``phase``)."""

    FORWARD = "forward"
    BACKWARD = "backward"  # a backward alone (JAX: the VJP of saved residuals)
    FORWARD_BACKWARD = "forward+backward"  # TensorFlow: a gradient needs its tape; backward = this - forward
    UPDATE = "update"  # the optimizer's update of one layer's variables
    STEP = "step"  # one whole compiled train step (forward, loss, backward, update)
    # The whole model's calls back to back, free to overlap (a TensorFlow loop runs up to 10 iterations
    # at once): throughput of independent calls, not one call's time (model.csv's overlapped_s).
    OVERLAPPED = "overlapped"

    def __str__(self) -> str:
        return self.value


# How metadata's input_source starts when the inputs were not a file: "synthetic (seed 0)",
# "in-memory arrays (sha256 ...)"; otherwise it is the --input file's path.
SYNTHETIC_INPUT = "synthetic"
ARRAYS_INPUT = "in-memory arrays"

# Settings that change what a number means: a resumed profile must match them. (Merging
# profiles from several machines checks the mode and, on one backend, XLA: profiles/merge.py.)
MEASUREMENT_SETTINGS = ("mode", "xla", "input_source", "prices_usd_per_hour", "timing", "backend", "training")


@dataclass
class LayerRecord:
    """One leaf layer call as a profile records it (``metadata.json`` "layers", in call order).

    The capture's ``LayerCall`` is this record with the live call attached, so what is
    captured and what is saved are one type. Optional fields are None where they do not
    apply and are left out of the file.
    """

    name: str
    type: str
    category: str
    params: int = 0
    input_shapes: list[list[int | None]] | None = None  # None: not captured (the loss, an activation timed apart)
    output_shapes: list[list[int | None]] | None = None
    input_bytes: int | None = None
    output_bytes: int | None = None
    batch_size: int | None = None  # the batch the shapes and bytes were captured at
    inactive: bool = False  # does nothing in the measured mode (Dropout, random augmentation in inference)
    trainable: bool | None = None  # has trainable variables (training profiles)
    grad_inputs: list[bool] | None = None  # per flat input: does training need its gradient (training profiles)
    # False: the compiled train step never runs it (an output activation whose logits the loss reads);
    # its row is shown, never summed. ``part_of``: the layer whose activation it is, timed apart.
    in_step: bool | None = None
    part_of: str | None = None
    # A shared layer's later call: the call that owns its variables (their update, weights and slots).
    weights_of: str | None = None

    def replace(self, **changes: Any) -> "LayerRecord":
        """This record (only the record, never a LayerCall's live call) with ``changes``."""
        return LayerRecord(**{**{f.name: getattr(self, f.name) for f in fields(LayerRecord)}, **changes})

    def as_dict(self) -> dict[str, Any]:
        """The file's entry: the record's own fields (not a LayerCall's live ones), None left out."""
        values = {f.name: getattr(self, f.name) for f in fields(LayerRecord)}
        return {k: v for k, v in values.items() if v is not None}

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> "LayerRecord":
        """A file's entry; keys this tbs does not know (a newer writer's) are ignored."""
        known = {f.name for f in fields(LayerRecord)}
        return cls(**{k: v for k, v in entry.items() if k in known})


# The nested records of metadata.json, typed. ``total=False``: a key may be missing (older writers),
# and a key a record does not declare is a newer writer's, let through; a declared key's value
# must have its type (``check_metadata``). A float field takes an int.
ModelRecord = TypedDict("ModelRecord", {"name": str, "keras_name": "str | None", "class": str, "path": "str | None",
                                        "sha256": "str | None", "format": "str | None", "params": "int | None"},
                        total=False)


class DeviceRecord(TypedDict, total=False):
    """One measured device (``Device.as_dict``; ``host``: the node group of a cluster profile)."""

    name: str
    kind: str
    description: str | None
    memory_bytes: int | None
    backend: str | None
    host: str | None


class TrainingRecord(TypedDict, total=False):
    """How a training profile trains: the loss and optimizer (each with its source), the targets, the backward."""

    loss: dict[str, Any]
    optimizer: dict[str, Any]
    targets: str
    note: str
    backward_method: str


class TransferFit(TypedDict, total=False):
    """A copy's cost between two devices: through ``points`` (bytes, median seconds per timed size) where a
    profile has them, else ``alpha_s + beta_s_per_byte * bytes`` (tbs.measure.transfers)."""

    alpha_s: float
    beta_s_per_byte: float
    points: list[list[float]]


class CalibrationRecord(TypedDict, total=False):
    """A device's measured ceilings: FLOP/s per dtype and read bandwidth, the programs timed, what failed."""

    matmul_flops_per_s: dict[str, float]
    memory_bytes_per_s: float | None
    programs: list[dict[str, Any]]
    failed: dict[str, str]


class CapacityRecord(TypedDict, total=False):
    """A device's memory fit and largest batch: estimated by the compiler, confirmed by real calls, or why not."""

    largest_batch: int | None
    estimated_batch: float | None
    estimate_capped: bool | None
    capped: bool | None
    limit_bytes: float | None
    tries: list[dict[str, Any]]
    reason: str | None
    note: str | None


@dataclass(frozen=True)
class Metadata:
    """``metadata.json``, typed: what was measured, where, how, and how far it got.

    Every stage reads the metadata through this view (``Profile.meta``, ``ProfileStore.meta``)
    and every key written must be one of its fields (``check_declared``, run on every write),
    so a key is declared once, here. The file stays plain JSON; a key this tbs does not know
    (a newer writer's) is ignored on read. Fields hold an empty value where the file lacks them.
    """

    tbs_profile_version: int | None = None
    tbs_version: str | None = None
    model: ModelRecord = field(default_factory=dict)  # type: ignore[assignment]
    inputs: list[dict[str, Any]] = field(default_factory=list)
    input_source: str | None = None
    seed: int | None = None
    mode: str | None = None  # "inference" | "training"
    # loss (name, source, serialized, weights), optimizer (name, config, source), backward_method, targets,
    # and note: why the model's own compile() was not used where it could not be restored
    training: TrainingRecord = field(default_factory=dict)  # type: ignore[assignment]
    samples: int | None = None  # the dataset's size (tbs.profile(dataset_size=), --dataset-size): the cost per epoch
    batch_sizes: list[int] = field(default_factory=list)
    devices: list[DeviceRecord] = field(default_factory=list)
    devices_missing: dict[str, str] = field(default_factory=dict)
    prices_usd_per_hour: dict[str, float] = field(default_factory=dict)
    spot_discount: dict[str, float] = field(default_factory=dict)
    price_sources: dict[str, dict[str, str]] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    xla: bool | None = None
    backend: str | None = None
    dedupe: bool | None = None  # identical layer calls measured once (shared_with names the row)
    # device@batch -> how its whole-model calls were traced (tool, calls, seconds it took) or why not (reason)
    in_context: dict[str, dict[str, Any]] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    started: str | None = None
    finished: str | None = None
    elapsed_s: float | None = None
    status: str | None = None
    error: str | None = None
    resumed: int | None = None
    layers: list[dict[str, Any]] = field(default_factory=list)  # LayerRecord.as_dict() per leaf call (Profile.layers)
    graph: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # batch -> edges
    transfers: dict[str, TransferFit] = field(default_factory=dict)  # "src->dst" -> fitted copy cost
    host_device: str | None = None
    # What analysis.csv's kernels' epilogue flags mean (tbs.backends.hlo_kernels.KERNEL_RULES); absent: 1
    kernel_rules: int | None = None
    harness_overhead: dict[str, dict[str, float]] = field(default_factory=dict)  # device@batch -> harness cost
    sampled_in_chunks: dict[str, int] = field(default_factory=dict)  # device@batch -> chunks (big models)
    environments: list[dict[str, Any]] = field(default_factory=list)  # merged or cluster: each machine's
    merged_from: list[str] = field(default_factory=list)
    calibration: dict[str, CalibrationRecord] = field(default_factory=dict)  # device -> achievable FLOP/s, bandwidth
    capacity: dict[str, CapacityRecord] = field(default_factory=dict)  # device -> memory fit, largest batch
    rebuilt: str | None = None  # metadata.json was damaged or lost and rebuilt from the rows and a --resume
    cluster: dict[str, dict[str, Any]] = field(default_factory=dict)  # node group -> its nodes and devices
    cluster_links: str | None = None  # how copies between a cluster's nodes were measured, or why not
    node_id: str | None = None  # a cluster node's own profile: the Ray node it ran on
    retries: list[dict[str, Any]] = field(default_factory=list)  # cluster tasks re-run on another node
    prediction: dict[str, Any] = field(default_factory=dict)  # how tbs.predict made the predictions
    predicted_devices: list[str] = field(default_factory=list)  # catalog ids placed as predicted devices

    # The declared keys the file holds (an empty value there is not a missing one).
    present: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def from_dict(cls, metadata: Mapping[str, Any]) -> "Metadata":
        """The typed view of a file's metadata; None in the file reads as the field's empty value."""
        values = {name: metadata[name] for name in METADATA_KEYS if metadata.get(name) is not None}
        return cls(**values, present=frozenset(values))

    def layer_records(self) -> list[LayerRecord]:
        """The ``layers`` entries, typed."""
        return [LayerRecord.from_dict(entry) for entry in self.layers]

    def recorded(self, name: str) -> Any:
        """Field ``name`` as the file holds it, None where the file lacks it (reports that mirror the file)."""
        if name not in METADATA_KEYS:
            raise KeyError(f"{name!r} is not a declared metadata key")
        return getattr(self, name) if name in self.present else None


def check_declared(metadata: Mapping[str, Any]) -> None:
    """Refuse to write a metadata key that ``Metadata`` does not declare (a writer's bug, caught by the tests)."""
    undeclared = sorted(set(metadata) - set(METADATA_KEYS))
    if undeclared:
        raise TypeError(f"metadata keys {undeclared} are not declared in tbs.schema.Metadata: declare them there")


METADATA_KEYS = tuple(f.name for f in fields(Metadata) if f.name != "present")
