"""The Python API: every tbs command as a call that returns a result object.

``profile`` measures and returns a ``Profile``; ``load`` reads saved profiles
(merged, re-priced); ``recommend`` places layers on devices (and can run the
placement for real); ``render`` turns results into text, HTML, JSON or CSV;
``devices`` says what is here and why the rest is missing. The CLI is a thin
layer over these. Arguments are checked before anything slow is imported, and
every mistake is a ``TbsError`` with one line naming the bad value and the fix.

``profile`` is here; ``load`` reads through ``tbs.loading``, and the other verbs are in
``tbs.verbs``: all of them are imported from here (and from ``tbs``).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tbs import backends, checks
from tbs.errors import StorageError, TbsError
from tbs.errors import warn as _warn
from tbs.loading import PathLike, load, load_modes  # noqa: F401  (load_modes: the CLI's, through tbs.api)
from tbs.measure.config import MeasureConfig, TrainingConfig
from tbs.measure.timing import TimingConfig
from tbs.profiles.files import write_text_atomic
from tbs.profiles.profile import Profile, load_profile
from tbs.profiles.store import ProfileStore, finalize
from tbs.progress import reporter
from tbs.run import Run, RunOptions
from tbs.verbs import cluster_groups, devices, diff, placement_for_report, predict, recommend, render, verify

__all__ = ["profile", "load", "recommend", "verify", "render", "devices", "predict", "diff", "cluster_groups",
           "placement_for_report"]


def profile(model: Any, batch_sizes: Iterable[int] = (32,), devices: str | Sequence[str] | None = None,
            prices: str | Mapping[str, float] | None = None, *, training: bool | TrainingConfig = False,
            dataset_size: int | None = None, backend: str | None = None, input: Any = None,
            custom_objects: Any = None, safe_mode: bool = True, out: PathLike | None = None, resume: bool = False,
            measure: MeasureConfig | None = None, timing: TimingConfig | None = None, progress: Any = "auto",
            report: bool = True, cluster: str | None = None) -> Profile:
    """Time every layer of ``model`` on each device and batch size; returns the Profile.

    ``model`` is a .pkl/.pickle/.keras/.h5 path or an in-memory ``keras.Model`` (copied once
    per device, in memory). ``input`` is a .npy/.npz/.pkl path or arrays (one array, a
    list, or a dict by input name). ``custom_objects`` is .py paths or a dict of classes.
    ``out=None`` measures into a temporary directory (``Profile.save`` keeps it).
    ``training=True`` (or a ``tbs.TrainingConfig`` naming a Keras loss/optimizer; default the
    model's compiled ones, else a stand-in) times each layer's forward, backward and optimizer
    update, the loss, and the whole compiled train step. ``dataset_size`` (samples per epoch)
    adds the cost of one pass over the data to the report. ``measure`` (a ``tbs.MeasureConfig``)
    says what else is measured and how programs are built: the compiler's analysis, identical
    calls measured once (``shared_with`` names the row they share), the largest batch confirmed
    by real calls, XLA on a backend that does not always compile with it, the synthetic inputs'
    seed; ``timing`` (a ``tbs.TimingConfig``) how each time is taken. Each device's memory per batch is fitted from
    the compiled programs, with the largest batch it allows (``metadata["capacity"]``).
    Ctrl-C stops after the current sample and returns what was measured, marked
    ``interrupted`` (``resume=True`` finishes it); a second Ctrl-C stops at once.
    """
    if out is not None and not checks.is_path(out):
        raise TbsError(f"out={out!r}: give a directory path, or None for a temporary directory")
    if backend is not None:
        backends.check(checks.text("backend", backend, "jax"))
    checked = dict(
        batch_sizes=checks.batch_sizes(batch_sizes), device_tokens=checks.device_tokens(devices),
        prices=checks.prices(prices), training=checks.training(training), backend=backend,
        dataset_size=checks.dataset_size(dataset_size), input=checks.input_data(input),
        custom_objects=checks.custom_objects(custom_objects), safe_mode=checks.flag("safe_mode", safe_mode),
        measure=checks.config("measure", measure, MeasureConfig), timing=checks.config("timing", timing, TimingConfig))
    model, progress, report = checks.model_or_path(model), reporter(progress), checks.flag("report", report)
    options = RunOptions(model=model, out=Path(out) if out is not None else None,
                         resume=checks.flag("resume", resume), **checked)
    if cluster is not None:
        return _profile_cluster(checks.text("cluster", cluster, "auto"), options, report, progress)
    if options.resume and out is None:
        raise TbsError("resume=True needs the unfinished profile's directory: pass out=p.directory (or the out= you used)")
    return _profile_here(options, report, progress)


def _profile_here(options: RunOptions, report: bool, progress: Any) -> Profile:
    """One run on this machine into ``options.out`` (locked while measured; a temporary directory where None)."""
    run = Run(options, progress, warn=_warn)
    store = ProfileStore(options.out) if options.out is not None else None
    if store is not None:
        store.lock()  # before the slow part: a directory being measured is refused at once
    try:
        run.prepare()
        if store is None:
            store = ProfileStore(Path(tempfile.mkdtemp(prefix=f"tbs-{run.model_name}-")))
            store.lock()
        directory = store.directory
        interrupted = run.measure_until_stopped(store)
        finished = None if interrupted else finalize(store)
    finally:
        if store is not None:
            store.unlock()
    result = finished or load_profile(directory)
    if report and not interrupted:
        _write_report(result, directory)
    return result


def _profile_cluster(cluster: str, options: RunOptions, report: bool, progress: Any) -> Profile:
    """One task per node group of a Ray cluster, every cell written into ``options.out`` as it arrives."""
    from tbs.cluster.driver import profile_cluster

    model = options.model
    if not checks.is_path(model) or not Path(model).is_file():
        raise TbsError(f"cluster={cluster!r}: give the model as a file (it travels to every node); {model!r} is not one")
    if options.input is not None and not checks.is_path(options.input):
        raise TbsError("cluster: give --input as a file (it travels to every node), not in-memory arrays")
    if options.custom_objects is not None and not isinstance(options.custom_objects, (list, tuple)):
        raise TbsError("cluster: give custom_objects as .py files (they travel to every node), not a dict of classes")
    directory = options.out if options.out is not None else Path(tempfile.mkdtemp(prefix="tbs-cluster-"))
    result = profile_cluster(cluster, dataclasses.replace(options, model=Path(model), out=directory),
                             progress=progress)
    if report and result.complete:
        _write_report(result, directory)
    return result


def _write_report(result: Profile, directory: Path) -> None:
    """The profile's report.html; a report that cannot be made (memory, disk) is a warning, not a lost profile."""
    try:
        page = render(result, "html", recommendation=placement_for_report(result))
        write_text_atomic(directory / "report.html", page, f"tbs report {directory} -o DIR/report.html makes it elsewhere")
    except StorageError as exc:
        _warn(f"report.html was not written: {exc}; the profile is complete")
    except MemoryError as exc:
        _warn(f"report.html was not written ({type(exc).__name__}: {exc}); the profile is complete: "
              f"tbs report {directory} -o report.html makes it")
