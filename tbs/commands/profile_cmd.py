"""`tbs profile`: check the request, load the model on each device, measure, save, print."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from tbs.errors import InputDataError, TbsError
from tbs.model import check_model_file

EXIT_INTERRUPTED = 130


class ClickProgress:
    """A click progress bar measured in seconds of real work, so its ETA is honest.

    Its position is the time spent so far and its length that plus the profiler's
    current estimate of what is left, so click's ETA is that estimate.
    """

    def __init__(self) -> None:
        self.bar: Any = None
        self.label = ""
        self.last = time.perf_counter()

    def start(self, remaining_seconds: float) -> None:
        self.last = time.perf_counter()
        self.bar = click.progressbar(
            length=max(int(remaining_seconds * 1000), 1), label="measuring", file=sys.stderr,
            show_eta=True, show_percent=True, width=24,
            item_show_func=lambda _: self.label[:60] if self.label else None,
        )
        self.bar.__enter__()

    def describe(self, label: str) -> None:
        self.label = label
        if self.bar is not None:
            self.bar.update(0, label)

    def advance(self, label: str, remaining_seconds: float) -> None:
        now = time.perf_counter()
        elapsed_ms, self.last = int((now - self.last) * 1000), now
        if self.bar is None:
            return
        self.bar.length = max(self.bar.pos + elapsed_ms + int(remaining_seconds * 1000), 1)
        self.bar.update(elapsed_ms, label)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def _status(message: str) -> None:
    """A transient line on a terminal (erased by the next one), so errors stay one line."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + message)
        sys.stderr.flush()


def _precheck(model_path: Path, custom_files: tuple[Path, ...], input_path: Path | None) -> None:
    """File problems that need no TensorFlow: report them before the slow import."""
    check_model_file(model_path)
    for path in custom_files:
        if not Path(path).is_file():
            raise TbsError(f"--custom-objects: file '{path}' does not exist; pass the .py file defining your layers")
    if input_path is not None and not Path(input_path).is_file():
        raise InputDataError(f"--input: file '{input_path}' does not exist; pass a .npy, .npz or pickle file")


def run_profile(**options: Any) -> None:
    """Entry point for `tbs profile` (options as parsed by the CLI)."""
    _precheck(options["model_path"], options["custom_files"], options["input_path"])
    try:
        _run(**options)
    finally:
        _status("")


def _run(model_path: Path, batch_sizes: list[int], device_tokens: list[str] | None,
         prices: dict[str, float] | None, training: bool, input_path: Path | None,
         custom_files: tuple[Path, ...], out_dir: Path | None, resume: bool, backend: str, xla: bool,
         min_samples: int, target_ci: float, max_cell_seconds: float, min_block_ms: float,
         min_span_seconds: float, seed: int) -> None:
    from tbs.backend import choose

    choose(backend)  # before anything imports Keras
    warn = lambda message: click.echo(f"Warning: {message}", err=True)  # noqa: E731
    _status(f"tbs: loading {backend} and {model_path} ...")

    from tbs import sysinfo
    from tbs.devices import discover, select
    from tbs.inputs import input_specs, load_user_input
    from tbs.model import import_custom_objects, load_model
    from tbs.profile import ProfileStore, finalize, load_profile
    from tbs.profiler import ProfileRequest, Profiler
    from tbs.report.console import render
    from tbs.timing import Interrupted, TimingConfig

    discovery = discover(backend)
    devices = select(discovery, device_tokens, warn)
    custom = import_custom_objects(list(custom_files))

    def load_on(device: Any) -> Any:
        return load_model(model_path, custom, scope=device.scope)

    loaded = load_on(devices[0])
    _status("")
    try:
        specs = input_specs(loaded.model)
    except Exception as exc:  # odd build state of a custom model: ask for data instead of guessing
        raise InputDataError(f"cannot read the input specs of model '{model_path}' ({exc}); pass --input FILE") from None
    user_arrays = load_user_input(Path(input_path), specs) if input_path else None
    if not specs:
        raise InputDataError(
            f"cannot tell the inputs of model '{model_path}' (none declared); pass --input FILE with sample data"
        )
    for spec in specs if user_arrays is None else []:
        if spec.has_unknown_dims:
            shape = "x".join(str(d) for d in spec.concrete_shape(1)[1:])
            warn(f"input {spec.describe()} has unknown dimensions; using {shape} (pass --input for your shapes)")

    directory = Path(out_dir) if out_dir else Path("profiles") / loaded.name
    store = ProfileStore(directory)
    existing = store.existing_status()
    prices = prices or {}
    config = TimingConfig(min_samples=min_samples, target_ci=target_ci, cell_budget_seconds=max_cell_seconds,
                          min_block_seconds=min_block_ms / 1000.0, min_span_seconds=min_span_seconds)
    metadata = {
        "tbs_profile_version": 1,
        "model": loaded.describe(),
        "inputs": [dict(name=s.name, shape=list(s.shape), dtype=s.dtype) for s in specs],
        "input_source": str(input_path) if input_path else f"synthetic (seed {seed})",
        "seed": seed,
        "mode": "training" if training else "inference",
        "batch_sizes": batch_sizes,
        "devices": [d.as_dict() for d in devices],
        "devices_missing": discovery.missing,
        "prices_usd_per_hour": prices,
        "host": sysinfo.host_info(),
        "versions": sysinfo.library_versions(backend),
        "settings": sysinfo.threading_settings(xla, backend),
        "timing": vars(config),
        "xla": bool(xla) or backend == "jax",
        "command": sys.argv,
        "started": sysinfo.now_iso(),
        "backend": backend,
    }
    if resume and existing in ("running", "interrupted", "complete"):
        finished = store.resume(metadata)
        click.echo(f"tbs: resuming {directory} ({finished} cells already measured)", err=True)
    else:
        if existing in ("running", "interrupted") and not resume:
            raise TbsError(
                f"'{directory}' holds an unfinished profile; add --resume to finish it, or --out DIR for a new one"
            )
        if resume:
            warn(f"nothing to resume in {directory}; starting a new profile")
        store.create(metadata)

    request = ProfileRequest(
        loaded=loaded, load_on=load_on, devices=devices, batch_sizes=batch_sizes, training=training,
        specs=specs, user_arrays=user_arrays, prices=prices, config=config, jit=xla,
        host=metadata["host"]["hostname"], seed=seed,
        host_device=next((d for d in discovery.devices if d.kind == "cpu"), None),
    )
    stop = {"requested": False}

    def request_stop() -> None:
        stop["requested"] = True
        click.echo("\ntbs: stopping after the current sample (Ctrl-C again to stop at once) ...", err=True)

    from tbs.cli import install_interrupt_handler

    previous = install_interrupt_handler(request_stop)
    progress = ClickProgress()
    started = time.perf_counter()
    try:
        Profiler(request, store, progress, should_stop=lambda: stop["requested"]).run()
    except TbsError as exc:  # e.g. the forward pass fails on the data: nothing to resume
        progress.finish()
        store.update_metadata(status="failed", error=str(exc))
        raise
    except (Interrupted, KeyboardInterrupt):
        progress.finish()
        store.update_metadata(status="interrupted", elapsed_s=time.perf_counter() - started)
        click.echo(
            f"tbs: interrupted; everything measured so far is saved in {directory}. "
            f"Finish it with the same command plus --resume.", err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    finally:
        signal.signal(signal.SIGINT, previous)
    store.update_metadata(finished=sysinfo.now_iso(), elapsed_s=time.perf_counter() - started)
    finalize(store)
    finished = load_profile(directory)
    click.echo(render(finished))
    from tbs.commands.report_cmd import write_report

    write_report(finished, directory / "report.html")
    click.echo(f"\nProfile saved in {directory}/ (summary.csv, model.csv, samples.csv, metadata.json, report.html)")
