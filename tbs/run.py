"""One profiling run behind ``tbs.profile``: check the request, load the model per device, measure, save.

Checks that need no framework come first (files, batch sizes), so a mistake is
reported before the slow import of the backend's framework; then the backend is chosen,
devices found, the model loaded on the first device and its inputs made.
"""

from __future__ import annotations

import hashlib
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tbs import backends
from tbs.backends.base import Device, select
from tbs.backends.hlo_kernels import KERNEL_RULES
from tbs.backends.host import host_info, now_iso
from tbs.checks import is_path
from tbs.cost.reprice import row_pricer
from tbs.errors import InputDataError, StorageError, TbsError
from tbs.load.inputs import (InputSpec, batch_arrays, check_input_arrays, input_specs, load_user_input,
                             structure_inputs)
from tbs.load.train_setup import TrainingSetup, fit_to_outputs, resolve as resolve_training
from tbs.load.model import (LoadedModel, ModelSource, check_model_file, import_custom_objects, load_model,
                            load_model_object)
from tbs.measure import neighbours
from tbs.measure.profiler import Profiler
from tbs.measure.request import ProfileRequest
from tbs.measure.config import MeasureConfig, TrainingConfig
from tbs.measure.timing import Interrupted, TimingConfig
from tbs.profiles.store import UNREADABLE, ProfileStore
from tbs.progress import Reporter
from tbs.schema import ARRAYS_INPUT, FORMAT_VERSION, SYNTHETIC_INPUT, ProfileStatus


@dataclass
class RunOptions:
    """One profiling request, checked: what ``tbs.profile`` was given, and what travels to cluster nodes."""

    model: Any  # a path, or an in-memory keras.Model
    out: Path | None
    resume: bool
    batch_sizes: list[int]
    device_tokens: list[str] | None
    prices: dict[str, float]
    training: TrainingConfig | None  # None: inference
    backend: str | None
    input: Any  # None, a path, or arrays
    custom_objects: Any  # None, .py paths, or a dict of classes
    safe_mode: bool
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    dataset_size: int | None = None  # the report's cost per epoch


def custom_object_dict(custom_objects: Any) -> dict[str, Any]:
    """Classes and functions by name, from what ``checks.custom_objects`` returned: None, a dict, or .py files."""
    if custom_objects is None:
        return {}
    if isinstance(custom_objects, Mapping):
        return dict(custom_objects)
    return import_custom_objects(list(custom_objects))


def _precheck(options: RunOptions) -> None:
    """File problems that need no framework: report them before the slow import."""
    if is_path(options.model):
        check_model_file(Path(options.model))
    if options.custom_objects is not None and not isinstance(options.custom_objects, Mapping):
        for path in options.custom_objects:
            if not Path(path).is_file():
                raise TbsError(f"--custom-objects: file '{path}' does not exist; pass the .py file defining your layers")
    if is_path(options.input) and not Path(options.input).is_file():
        raise InputDataError(f"--input: file '{options.input}' does not exist; pass a .npy, .npz or pickle file")
    if options.backend is not None:
        backends.check(options.backend)


def _backend_for(options: RunOptions) -> str:
    """The backend asked for; an in-memory model runs on the backend Keras already uses."""
    running = backends.current()  # what Keras uses, or will: KERAS_BACKEND, else the default
    if is_path(options.model):
        return options.backend or running
    if options.backend and options.backend != running:
        raise TbsError(f"backend '{options.backend}': this in-memory model lives on Keras's {running} backend; "
                       f"pass backend='{running}', or save the model and profile the file in a new process")
    return running


def _array_digest(arrays: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(str((array.shape, array.dtype)).encode())
        digest.update(np.ascontiguousarray(array).tobytes() if array.dtype.kind not in "OSU" else repr(array.tolist()).encode())
    return digest.hexdigest()[:16]


class Run:
    """The state of one ``tbs.profile`` call, from checked options to a measured store."""

    def __init__(self, options: RunOptions, reporter: Reporter, warn: Callable[[str], None]) -> None:
        self.options = options
        self.reporter = reporter
        self.warn = warn
        self.registration: neighbours.Registration | None = None
        self.source: ModelSource | None = None

    def prepare(self) -> None:
        """Check, choose the backend, find devices, load the model once, make its inputs."""
        o = self.options
        _precheck(o)
        self.backend = _backend_for(o)
        backends.choose(self.backend)  # before anything imports Keras
        self.reporter.status(f"tbs: loading {self.backend} and {o.model if is_path(o.model) else 'the model'} ...")
        self.discovery = backends.discover(self.backend)
        self.devices = select(self.discovery, o.device_tokens, self.warn)
        self._prices_without_a_device()
        self.custom = custom_object_dict(o.custom_objects)
        self.loaded = self.load_on(self.devices[0])
        self.reporter.status("")
        self.specs, self.user_arrays = self._inputs()
        self.model_name = self.loaded.name
        self.training = self._training_setup() if o.training is not None else None
        if self.training is not None and self.training.note:
            self.warn(f"{self.training.note}; timing the stand-ins ({self.training.loss_name}, "
                      f"{self.training.optimizer_name}) instead")

    def _prices_without_a_device(self) -> None:
        """Say once why a price prices nothing here (``gpu=3`` on a machine without a GPU), where the README's
        quick start would otherwise pass it over in silence."""
        kinds, names = {d.kind for d in self.devices}, {d.name for d in self.devices}
        found = {d.kind for d in self.discovery.devices} | {d.name for d in self.discovery.devices}
        skipped = set(self.options.device_tokens or ())  # select() said why a requested device is missing
        for key, usd_per_hour in (self.options.prices or {}).items():
            kind = key.split(":")[0]
            if key in names or (key == kind and kind in kinds) or key in skipped:
                continue
            why = (f"{key} is not among the devices this run measures" if key in found else
                   f"no {key} here ({self.discovery.missing.get(kind) or 'no such device on this machine'})")
            self.warn(f"{key}={usd_per_hour:g} $/h prices nothing in this profile: {why}; "
                      f"the measured devices are priced as given")

    def _training_setup(self) -> TrainingSetup:
        """The loss and optimizer to time, fitted to the model's outputs.

        A subclassed model declares no outputs: one small call shows them, so its compiled loss
        (or the stand-in) fits them and the loss recorded in the metadata (checked on --resume)
        is the one measured.
        """
        o, model = self.options, self.loaded.model
        outputs = None
        if not getattr(model, "outputs", None):
            sample = structure_inputs(model, batch_arrays(self.specs, 2, o.measure.seed, self.user_arrays), self.specs)
            outputs = model(sample, training=False)
        setup = resolve_training(model, o.training.loss, o.training.optimizer, self.loaded.compile_note, outputs)
        if outputs is not None:
            fit_to_outputs(setup, outputs)
        return setup

    def load_on(self, device: Device) -> LoadedModel:
        o = self.options
        if is_path(o.model):
            # Training restores the file's own compile(): its loss and optimizer are what it trains with.
            loaded = load_model(Path(o.model), self.custom, scope=device.scope, safe_mode=o.safe_mode,
                                compile=o.training is not None)
        else:
            if self.source is None:  # pickled and hashed once, copied once per device
                self.source = ModelSource.of(o.model)
            loaded = load_model_object(self.source, scope=device.scope)
        device.fit_model(loaded.model)
        return loaded

    def _inputs(self) -> tuple[list[InputSpec], list[np.ndarray] | None]:
        o, name = self.options, self.loaded.name
        try:
            specs = input_specs(self.loaded.model)
        except Exception as exc:  # odd build state of a custom model: ask for data instead of guessing
            raise InputDataError(f"cannot read the input specs of model '{name}' ({exc}); pass --input FILE") from None
        user = None
        if is_path(o.input):
            user = load_user_input(Path(o.input), specs)
        elif o.input is not None:
            user = check_input_arrays(o.input, specs, "the input arrays")
        if not specs:
            raise InputDataError(f"cannot tell the inputs of model '{name}' (none declared); pass --input FILE with sample data")
        for spec in specs if user is None else []:
            if spec.has_unknown_dims:
                shape = "x".join(str(d) for d in spec.concrete_shape(1)[1:])
                self.warn(f"input {spec.describe()} has unknown dimensions; using {shape} (pass --input for your shapes)")
        return specs, user

    def _input_source(self) -> str:
        o = self.options
        if is_path(o.input):
            return str(o.input)
        if self.user_arrays is not None:
            return f"{ARRAYS_INPUT} (sha256 {_array_digest(self.user_arrays)})"
        return f"{SYNTHETIC_INPUT} (seed {o.measure.seed})"

    def metadata(self) -> dict[str, Any]:
        o = self.options
        env = backends.environment(self.backend, o.measure.xla)
        return {
            "tbs_profile_version": FORMAT_VERSION, "tbs_version": env["versions"].get("tbs", "unknown"),
            "model": self.loaded.describe(),
            "inputs": [dict(name=s.name, shape=list(s.shape), dtype=s.dtype) for s in self.specs],
            "input_source": self._input_source(), "seed": o.measure.seed,
            "mode": "training" if o.training is not None else "inference", "batch_sizes": o.batch_sizes,
            "devices": [d.as_dict() for d in self.devices], "devices_missing": self.discovery.missing,
            "prices_usd_per_hour": o.prices, "host": host_info(), "versions": env["versions"],
            "settings": env["settings"], "timing": asdict(o.timing), "xla": env["xla"],
            "command": list(sys.argv), "started": now_iso(), "backend": self.backend, "dedupe": o.measure.dedupe,
            "kernel_rules": KERNEL_RULES,
            **({"samples": o.dataset_size} if o.dataset_size is not None else {}),
            **({"training": dict(self.training.as_dict(o.measure.seed), backward_method=self.devices[0].backward_method)}
               if self.training is not None else {}),
        }

    def start(self, store: ProfileStore) -> None:
        """A new profile in the store, or the unfinished one reopened with --resume.

        Measured rows are never deleted: a damaged or lost metadata.json is rebuilt (with
        --resume) or refused, and a finished profile in the way is moved aside.
        """
        existing = store.existing_status()
        metadata = self.metadata()
        unfinished = (ProfileStatus.RUNNING, ProfileStatus.INTERRUPTED)
        if existing == UNREADABLE:
            if not self.options.resume:
                raise TbsError(f"'{store.directory}' holds measured rows but its metadata.json is damaged or missing; "
                               f"add --resume to rebuild it from the rows and finish the profile, or use --out DIR "
                               f"for a new one")
            self.warn(store.rebuild(metadata))
            existing = ProfileStatus.RUNNING.value
        if self.options.resume and existing in unfinished + (ProfileStatus.COMPLETE,):
            finished = store.resume(metadata)
            self.reporter.note(f"tbs: resuming {store.directory} ({finished} cells already measured)")
        else:
            if existing in unfinished and not self.options.resume:
                raise TbsError(f"'{store.directory}' holds an unfinished profile; add --resume to finish it, "
                               f"or --out DIR for a new one")
            if self.options.resume:
                self.warn(f"nothing to resume in {store.directory}; starting a new profile")
            store.create(metadata)
            if store.set_aside_to is not None:
                self.warn(f"the profile already in {store.directory} was moved to {store.set_aside_to} "
                          f"(nothing measured is deleted)")
        self.registration = neighbours.register(str(store.directory), self.warn)

    def measure(self, store: ProfileStore, should_stop: Callable[[], bool]) -> None:
        o = self.options
        request = ProfileRequest(
            loaded=self.loaded, load_on=self.load_on, devices=self.devices, batch_sizes=o.batch_sizes,
            training=o.training is not None, specs=self.specs, user_arrays=self.user_arrays, config=o.timing,
            xla=o.measure.xla, host=str(store.meta.host.get("hostname", "")), seed=o.measure.seed,
            host_device=next((d for d in self.discovery.devices if d.kind == "cpu"), None),
            price_row=row_pricer(o.prices), training_setup=self.training, capacity=o.measure.capacity,
            analysis=o.measure.analysis, dedupe=o.measure.dedupe, in_context=o.measure.in_context,
        )
        Profiler(request, store, self.reporter, should_stop=should_stop).run()

    def measure_until_stopped(self, store: ProfileStore) -> bool:
        """Start or resume the profile in ``store`` and measure it; returns whether Ctrl-C stopped it.

        What was measured is kept whatever stops the run: a full or read-only disk marks the profile
        interrupted (``--resume`` finishes it), a failing forward pass marks it failed, Ctrl-C stops
        after the current sample (a second Ctrl-C at once).
        """
        stop = {"requested": False}

        def request_stop() -> None:
            stop["requested"] = True
            self.reporter.note("\ntbs: stopping after the current sample (Ctrl-C again to stop at once) ...")

        self.start(store)  # refusals (an unfinished profile without --resume) leave the directory as it was
        previous = _install_interrupt_handler(request_stop)
        started = time.perf_counter()
        try:
            self.measure(store, should_stop=lambda: stop["requested"])
        except StorageError as exc:  # a full or read-only disk: what was written stays, --resume finishes it
            self.reporter.finish()
            store.mark_interrupted(str(exc))
            raise
        except TbsError as exc:  # e.g. the forward pass fails on the data: nothing to resume
            self.reporter.finish()
            store.update_metadata(status=ProfileStatus.FAILED.value, error=str(exc))
            raise
        except (Interrupted, KeyboardInterrupt) as exc:
            self.reporter.finish()
            store.update_metadata(status=ProfileStatus.INTERRUPTED.value, elapsed_s=time.perf_counter() - started)
            if isinstance(exc, KeyboardInterrupt):
                raise
            return True
        finally:
            self.close()
            if previous is not _NOT_INSTALLED:
                signal.signal(signal.SIGINT, previous)
        store.update_metadata(finished=now_iso(), elapsed_s=time.perf_counter() - started)
        return False

    def close(self) -> None:
        if self.registration is not None:
            self.registration.close()
            self.registration = None


_NOT_INSTALLED = object()


def _install_interrupt_handler(on_first: Callable[[], None]) -> Any:
    """First Ctrl-C: finish the current sample and stop cleanly. Second: stop at once (main thread only).

    Returns the handler it replaced (which may be None, one installed outside Python), to restore.
    """
    if threading.current_thread() is not threading.main_thread():
        return _NOT_INSTALLED
    state = {"count": 0}

    def handler(signum: int, frame: Any) -> None:
        state["count"] += 1
        if state["count"] == 1:
            on_first()
        else:
            raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, handler)
