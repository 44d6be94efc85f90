"""The commands: parse flags, call the API, print and write what it returns.

Every user mistake is a TbsError or a click usage error and ends as one line on
stderr with exit code 2. The backend's framework is imported only after the arguments
and files have been checked, so those errors come back at once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tbs import api
from tbs.backends import BACKENDS, REGISTRY
from tbs.backends import DEFAULT as DEFAULT_BACKEND
from tbs.backends.base import parse_device_tokens
from tbs.cli.options import (EXIT_INTERRUPTED, BatchSizes, Parsed, Percent, TbsGroup, dataset_size_options,
                             pick_dataset_size)
from tbs.cost.prices import parse_prices, parse_spot
from tbs.errors import StorageError, TbsError
from tbs.profiles.files import write_text_atomic
from tbs.measure.config import MeasureConfig, TrainingConfig
from tbs.measure.timing import TimingConfig
from tbs.progress import TerminalProgress
from tbs.report.console import verification_text
from tbs.report.groups import DEFAULT_TOP, GROUPINGS
from tbs.units import is_number

PRICES = Parsed("KIND=USD_PER_HOUR[,...]", parse_prices)
SPOT_DISCOUNTS = Parsed("DEVICE=FRACTION[,...]", parse_spot)
DEVICE_TOKENS = Parsed("cpu,gpu,tpu", parse_device_tokens)
BACKEND_HELP = "Keras backend that runs the model (" + "; ".join(
    f"{b.name}: {b.install}" + ("" if b.string_ops else ", no string ops") for b in REGISTRY.values()) + ")."
XLA_HELP = ("Compile with XLA (jit_compile=True) instead of the backend's graphs. Always on for: "
            + ", ".join(b.name for b in REGISTRY.values() if b.always_xla) + ".")
NO_SAFE_MODE_HELP = "Load a .keras or .h5 file that runs arbitrary code (Lambda layers); only for files you trust."


@click.group(cls=TbsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tbs")
def cli() -> None:
    """tbs: time every layer of a Keras model on every device, and what it costs."""


def _training(training: bool, loss: str | None, optimizer: str | None) -> TrainingConfig | bool:
    """--training, with --loss/--optimizer when given (either one without --training is refused by name)."""
    for name, value in (("loss", loss), ("optimizer", optimizer)):
        if value is not None and not training:
            raise TbsError(f"--{name} sets what training uses: add --training (training=True), or leave it out")
    return TrainingConfig(loss=loss, optimizer=optimizer) if training else False


@cli.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path, dir_okay=True))
@click.option("--batch", "batch_sizes", type=BatchSizes(), default="32", show_default=True,
              help="Batch sizes to measure, comma-separated.")
@click.option("--devices", "device_tokens", type=DEVICE_TOKENS, default=None,
              help="Devices to use: kinds (cpu,gpu,tpu) or names (gpu:1). Default: every device found.")
@click.option("--cost", "prices", type=PRICES, default=None,
              help="USD per hour per device kind or name, e.g. cpu=0.5,gpu=3.")
@click.option("--training", is_flag=True,
              help="Time training: each layer's forward, backward and optimizer update, the loss, and the whole train step.")
@click.option("--loss", default=None, help="With --training: a Keras loss name (default: the model's compiled loss, "
                                           "else sparse categorical cross-entropy for class scores, MSE otherwise).")
@click.option("--optimizer", default=None, help="With --training: a Keras optimizer name (default: the model's, else adam).")
@dataset_size_options("The dataset's size: the report adds the cost per epoch (with --training) or per N samples.")
@click.option("--input", "input_path", type=click.Path(path_type=Path), default=None,
              help="Your data (.npy, .npz or pickle) instead of synthetic inputs; repeated or sliced to each batch.")
@click.option("--custom-objects", "custom_files", type=click.Path(path_type=Path), multiple=True,
              help="Python file defining custom layers/models to import before loading (repeatable).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Profile directory. Default: profiles/<model file name>.")
@click.option("--resume", is_flag=True, help="Finish an interrupted profile, measuring only missing cells.")
@click.option("--backend", type=click.Choice(BACKENDS), default=DEFAULT_BACKEND, show_default=True,
              help=BACKEND_HELP)
@click.option("--xla", is_flag=True, help=XLA_HELP)
@click.option("--no-safe-mode", is_flag=True, help=NO_SAFE_MODE_HELP)
@click.option("--min-samples", type=click.IntRange(min=3), default=10, show_default=True,
              help="Least timed samples per cell.")
@click.option("--target-ci", type=click.FloatRange(min=0.001, max=1.0), default=0.05, show_default=True,
              help="Stop sampling when the 95% CI of the median is within this fraction of it.")
@click.option("--max-cell-seconds", type=click.FloatRange(min=0.01), default=1.5, show_default=True,
              help="Time budget per cell after its minimum samples; cells that run out are marked noisy.")
@click.option("--min-block-ms", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Each sample repeats the call until it lasts this long (amortises dispatch).")
@click.option("--min-span-seconds", type=click.FloatRange(min=0.0), default=2.0, show_default=True,
              help="A cell's samples must spread over this much wall time (drift on shared machines).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for synthetic inputs.")
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Measure on every node group of a Ray cluster (auto, or ray://HOST:PORT; needs tbs[ray]).")
@click.option("--no-analysis", is_flag=True, help="Skip the compiler's FLOPs/bytes/memory per cell and the devices' "
                                                  "calibration (faster on big models; no roofline, no tbs predict).")
@click.option("--no-dedupe", is_flag=True, help="Measure every layer call on its own (default: identical calls, "
                                                "same type, config and shapes, are measured once and share that row).")
@click.option("--no-in-context", is_flag=True, help="Skip tracing a few whole-model calls with the framework's "
                                                    "profiler after their samples (each layer's in-model time).")
@click.option("--capacity", is_flag=True, help="After timing, find each device's largest batch that fits by real "
                                               "calls that double while the measured peak allows (uses most of its memory).")
def profile(model_path: Path, out_dir: Path | None, min_samples: int, target_ci: float, max_cell_seconds: float,
            min_block_ms: float, min_span_seconds: float, no_safe_mode: bool, **options: Any) -> None:
    """Time every layer of MODEL on each device and batch size; save under profiles/."""
    timing = TimingConfig(min_samples=min_samples, target_ci=target_ci, cell_budget_seconds=max_cell_seconds,
                          min_block_seconds=min_block_ms / 1000.0, min_span_seconds=min_span_seconds)
    measure = MeasureConfig(xla=options["xla"], analysis=not options["no_analysis"], dedupe=not options["no_dedupe"],
                            capacity=options["capacity"], seed=options["seed"], in_context=not options["no_in_context"])
    directory = out_dir or Path("profiles") / model_path.stem
    try:
        result = api.profile(
            model_path, options["batch_sizes"], options["device_tokens"], options["prices"],
            training=_training(options["training"], options["loss"], options["optimizer"]),
            dataset_size=pick_dataset_size(options["dataset_size"], options["old_samples"]),
            backend=options["backend"], input=options["input_path"],
            custom_objects=list(options["custom_files"]) or None, safe_mode=not no_safe_mode, out=directory,
            resume=options["resume"], measure=measure, timing=timing, progress=TerminalProgress(),
            cluster=options["cluster"])
    except KeyboardInterrupt:
        _interrupted(directory)
    if not result.complete:
        _interrupted(directory)
    click.echo(api.render(result, "text"))
    click.echo(f"\nProfile saved in {directory}/ (summary.csv, model.csv, analysis.csv, samples.csv, metadata.json, "
               f"report.html)")


def _interrupted(directory: Path) -> None:
    click.echo(f"tbs: interrupted; everything measured so far is saved in {directory}. "
               f"Finish it with the same command plus --resume.", err=True)
    sys.exit(EXIT_INTERRUPTED)


@cli.command()
@click.argument("directories", metavar="PROFILE_DIR...", nargs=-1, type=click.Path(path_type=Path))
@click.option("--cost", "prices", type=PRICES, default=None,
              help="Re-price: USD per hour (gpu=3, gpu=3/h) or amortised hardware (cpu=capex:25000/1y).")
@click.option("--spot", type=SPOT_DISCOUNTS, default=None, help="Spot/preemptible discount, e.g. tpu=0.7 (70% off).")
@click.option("--prices", "price_file", type=click.Path(path_type=Path), default=None,
              help="CSV or YAML price list (device, price, source, date).")
@dataset_size_options("Also show the cost of a workload of N samples (in training: one epoch).")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the HTML report here (self-contained); with --format trace, the trace.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "csv", "predicted", "trace"]), default="text",
              show_default=True, help="Terminal output when no -o is given (predicted: tbs predict's per-layer "
                                      "table of predicted devices; trace: a Chrome/Perfetto trace-event JSON of the "
                                      "in-context calls op by op under their layers, and of the isolated cells).")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help=f"Show the N heaviest layers (or groups), the rest folded into one line. [default: {DEFAULT_TOP}]")
@click.option("--all", "every_layer", is_flag=True, help="Show every layer, in model order (no fold).")
@click.option("--group", type=click.Choice(GROUPINGS), default=None,
              help="Text: totals per layer kind (conv, activation, ...) or per block (Keras nesting, or the name "
                   "prefix: conv2_block1) instead of the layers.")
def report(directories: tuple[Path, ...], prices: dict[str, float] | None, spot: dict[str, float] | None,
           price_file: Path | None, dataset_size: int | None, old_samples: int | None, output: Path | None, fmt: str,
           top: int | None, every_layer: bool, group: str | None) -> None:
    """Report saved profiles (several machines' profiles of one model merge) without measuring."""
    if every_layer and top is not None:
        raise TbsError(f"--top {top} and --all contradict each other: give one of them")
    shown = None if every_layer else top or DEFAULT_TOP
    dataset_size = pick_dataset_size(dataset_size, old_samples)
    result, other = api.load_modes(*directories, prices=prices, spot=spot, price_file=price_file)
    if output is None or fmt == "trace":
        text = api.render(result, fmt, dataset_size=dataset_size, other_mode=other, top=shown, group=group)
        if output is None:
            click.echo(text.rstrip("\n") if fmt == "csv" else text)
            return
        _write(output, text)
        click.echo(f"Trace written to {output} (open it in https://ui.perfetto.dev or chrome://tracing)")
        return
    page = api.render(result, "html", recommendation=api.placement_for_report(result), dataset_size=dataset_size,
                      other_mode=other, top=shown,
                      other_mode_recommendation=None if other is None else api.placement_for_report(other))
    _write(output, page)
    click.echo(f"Report written to {output}")


def _write(output: Path, text: str) -> None:
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(output.parent, exc, "choose another -o") from None
    write_text_atomic(output, text, "choose another -o")


@cli.command()
@click.argument("directory", metavar="PROFILE_DIR", type=click.Path(path_type=Path))
@click.option("--cost", "prices", type=PRICES, default=None, help="Prices (as for tbs report); default: the profile's.")
@click.option("--spot", type=SPOT_DISCOUNTS, default=None, help="Spot/preemptible discount, e.g. tpu=0.7.")
@click.option("--objective", type=click.Choice(["cost", "time"]), default="cost", show_default=True)
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=None,
              help="Batch size to place for (default: the largest profiled with a time for every layer).")
@click.option("--max-latency", "max_latency_ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --objective cost: at most this many ms per batch.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --objective time: at most this many USD per 1M samples.")
@click.option("--billing", type=click.Choice(["metered", "dedicated"]), default="metered", show_default=True,
              help="metered: pay each device for its busy seconds; dedicated: pay every used device for the whole run.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--verify", is_flag=True, help="Run the placement and the single devices for real; predicted vs measured.")
@click.option("--include-predicted", is_flag=True,
              help="Also place on the devices tbs predict added (labelled; their host links are assumed).")
@click.option("--custom-objects", "custom_files", type=click.Path(path_type=Path), multiple=True,
              help="With --verify: Python file defining the model's custom classes (repeatable).")
@click.option("--no-safe-mode", is_flag=True, help=f"With --verify: {NO_SAFE_MODE_HELP}")
def recommend(directory: Path, prices: dict[str, float] | None, spot: dict[str, float] | None, objective: str,
              batch_size: int | None, max_latency_ms: float | None, budget: float | None, billing: str, fmt: str,
              verify: bool, custom_files: tuple[Path, ...], no_safe_mode: bool, include_predicted: bool) -> None:
    """Which device each layer should run on, transfers included (exact), against single devices."""
    profile = api.load(directory, prices=prices, spot=spot)
    if verify and include_predicted:
        raise TbsError("--verify runs placements for real and predicted devices are not here: drop --include-predicted")
    rec = api.recommend(profile, objective, batch_size=batch_size, billing=billing, max_latency_ms=max_latency_ms,
                        budget_usd_per_1m=budget, include_predicted=include_predicted)
    click.echo(api.render(None, fmt, recommendation=rec))
    if verify:  # printed after the prediction, which is worth seeing while the replay runs
        api.verify(profile, rec, custom_objects=list(custom_files) or None, safe_mode=not no_safe_mode)
        click.echo(verification_text(rec.verification))


@cli.command()
@click.argument("directory", metavar="PROFILE_DIR", type=click.Path(path_type=Path))
@click.option("--device", "targets", required=True,
              help="Catalog devices to predict, e.g. l4,h100,tpu-v5e (tbs devices --catalog lists them).")
@click.option("--from", "source", default=None, help="The measured device to scale from (default: one of the "
                                                     "target's kind, else the CPU).")
@click.option("--catalog", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A device catalog CSV with the shipped one's columns (default: the shipped catalog).")
@click.option("--cost", "prices", type=PRICES, default=None, help="Override catalog prices by device id, e.g. h100=2.5.")
def predict(directory: Path, targets: str, source: str | None, catalog: Path | None,
            prices: dict[str, float] | None) -> None:
    """Predict every layer on catalog devices you do not have (labelled, never mixed with measured cells)."""
    if catalog is not None and not catalog.is_file():
        raise TbsError(f"--catalog: '{catalog}' does not exist; give a CSV with the columns of tbs/predictions/catalog.csv")
    result = api.predict(api.load(directory), targets, source=source, catalog=catalog, prices=prices)
    path = result.save_predictions()
    click.echo(api.render(result, "predicted"))
    click.echo(f"\nPredictions saved in {path} (source=predicted; tbs report shows them apart; "
               f"tbs recommend --include-predicted uses them)")


@cli.command()
@click.argument("base", metavar="BASE", type=click.Path(path_type=Path))
@click.argument("new", metavar="NEW", type=click.Path(path_type=Path))
@click.option("--threshold", type=Percent(), default="10%", show_default=True,
              help="Exit 1 when a cell is slower than this beyond noise (or fails where BASE ran).")
@click.option("--gate", type=click.Choice(["all", "model"]), default="all", show_default=True,
              help="What the threshold gates: every cell, or only the whole model.")
@click.option("--confidence", type=click.FloatRange(min=0.5, max=1.0, max_open=True), default=0.95,
              show_default=True, help="Level of the intervals and of the verdicts (corrected for the number of cells).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text", show_default=True,
              help="markdown: for a CI comment; json: every cell.")
@click.option("--all", "every_cell", is_flag=True, help="Show every layer cell, not only those that changed.")
@click.option("--force", is_flag=True, help="Compare profiles measured with different settings (mode, backend, "
                                            "XLA, input) anyway.")
@click.option("--cost", "prices", type=PRICES, default=None, help="Price both sides alike (as for tbs report).")
@click.option("--spot", type=SPOT_DISCOUNTS, default=None, help="Spot/preemptible discount for both sides, e.g. tpu=0.7.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the output to this file instead of the terminal (the exit code is the same).")
def diff(base: Path, new: Path, threshold: float, gate: str, confidence: float, fmt: str, every_cell: bool,
         force: bool, prices: dict[str, float] | None, spot: dict[str, float] | None, output: Path | None) -> int:
    """Compare NEW against BASE per layer, device and batch; exit 1 on a regression beyond --threshold."""
    result = api.diff(base, new, threshold=threshold, confidence=confidence, force=force, gate=gate, prices=prices,
                      spot=spot)
    text = api.render(result, fmt, top=None if every_cell else DEFAULT_TOP)
    if output is None:
        click.echo(text.rstrip("\n"))
    else:
        write_text_atomic(output, text, "choose another -o")
        click.echo(f"Diff written to {output}" + (" (regression)" if result.regressed else ""))
    return 1 if result.regressed else 0


@cli.command()
@click.option("--catalog", "show_catalog", is_flag=True, help="List the device catalog tbs predicts for instead.")
@click.option("--cluster", "cluster", default=None, metavar="ADDRESS",
              help="List a Ray cluster's node groups instead (auto, or ray://HOST:PORT; needs tbs[ray]).")
@click.option("--backend", "backends", type=click.Choice(BACKENDS), multiple=True,
              help="Only this backend (repeatable). Default: every backend.")
def devices(backends: tuple[str, ...], show_catalog: bool, cluster: str | None) -> None:
    """List each backend's devices, and why a backend or device kind is unavailable."""
    if cluster is not None:
        from tbs.cluster.discovery import describe

        click.echo(describe(api.cluster_groups(cluster)))
        return
    if show_catalog:
        from tbs.predictions.catalog import catalog_frame

        click.echo(catalog_frame().to_string(index=False, na_rep=""))
        return
    table = api.devices(list(backends) or None)
    for name, rows in table.groupby("backend", sort=False):
        click.echo(f"{name}:")
        for row in rows.to_dict("records"):
            if row["available"]:
                memory = f", {row['memory_bytes'] / 2**30:.1f} GiB" if is_number(row["memory_bytes"]) else ""
                click.echo(f"  {row['device']:8} {row['kind']:4} {row['description']}{memory}")
            elif not isinstance(row["kind"], str):
                click.echo(f"  unavailable: {row['reason']}")
            else:
                click.echo(f"  {row['kind']:8} -    {row['reason']}")


def main() -> None:
    cli(prog_name="tbs")
