"""The tbs command line: argument parsing, one-line errors, progress, and wiring.

Every user mistake is a TbsError or a click usage error and ends as one line on
stderr with exit code 2. TensorFlow is imported only after the arguments and
files have been checked, so those errors come back at once.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

from tbs.cost import parse_prices, parse_spot
from tbs.backend import BACKENDS
from tbs.devices import parse_device_tokens
from tbs.errors import TbsError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class TbsGroup(click.Group):
    """A click group whose errors are one line on stderr, exit code 2, no traceback."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `tbs`: help, as any CLI would
            click.echo(exc.ctx.get_help() if exc.ctx else "")
            sys.exit(0)
        except click.UsageError as exc:
            _fail(exc.format_message())
        except click.ClickException as exc:
            _fail(exc.format_message())
        except TbsError as exc:
            _fail(str(exc))
        except (click.Abort, KeyboardInterrupt):
            click.echo("Interrupted.", err=True)
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(result, int) and result != 0:
            sys.exit(result)
        sys.exit(0)


def _fail(message: str) -> None:
    click.echo(f"Error: {' '.join(str(message).split())}", err=True)
    sys.exit(EXIT_USAGE)


class BatchSizes(click.ParamType):
    name = "N[,N...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[int]:
        if isinstance(value, list):
            return value
        sizes = []
        for part in str(value).split(","):
            part = part.strip()
            try:
                size = int(part)
            except ValueError:
                self.fail(f"batch size '{part}' is not a whole number; write e.g. --batch 32,512", param, ctx)
            if size < 1:
                self.fail(f"batch size {size} must be at least 1; write e.g. --batch 32,512", param, ctx)
            sizes.append(size)
        return sorted(set(sizes))


class Prices(click.ParamType):
    name = "KIND=USD_PER_HOUR[,...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> dict[str, float]:
        if isinstance(value, dict):
            return value
        return parse_prices(str(value))


class SpotDiscounts(click.ParamType):
    name = "DEVICE=FRACTION[,...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> dict[str, float]:
        if isinstance(value, dict):
            return value
        return parse_spot(str(value))


class DeviceTokens(click.ParamType):
    name = "cpu,gpu,tpu"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[str]:
        if isinstance(value, list):
            return value
        return parse_device_tokens(str(value))


@click.group(cls=TbsGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tbs")
def cli() -> None:
    """tbs: time every layer of a Keras model on every device, and what it costs."""


@cli.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path, dir_okay=True))
@click.option("--batch", "batch_sizes", type=BatchSizes(), default="32", show_default=True,
              help="Batch sizes to measure, comma-separated.")
@click.option("--devices", "device_tokens", type=DeviceTokens(), default=None,
              help="Devices to use: kinds (cpu,gpu,tpu) or names (gpu:1). Default: every device found.")
@click.option("--cost", "prices", type=Prices(), default=None,
              help="USD per hour per device kind or name, e.g. cpu=0.5,gpu=3.")
@click.option("--training", is_flag=True, help="Time the forward pass as in training (augmentation, dropout active).")
@click.option("--input", "input_path", type=click.Path(path_type=Path), default=None,
              help="Your data (.npy, .npz or pickle) instead of synthetic inputs; repeated or sliced to each batch.")
@click.option("--custom-objects", "custom_files", type=click.Path(path_type=Path), multiple=True,
              help="Python file defining custom layers/models to import before loading (repeatable).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Profile directory. Default: profiles/<model file name>.")
@click.option("--resume", is_flag=True, help="Finish an interrupted profile, measuring only missing cells.")
@click.option("--backend", type=click.Choice(BACKENDS), default="tensorflow", show_default=True,
              help="Keras backend that runs the model (jax: pip install 'tbs[jax]').")
@click.option("--xla", is_flag=True, help="TensorFlow: compile with XLA (jit_compile=True) instead of graphs. "
                                          "JAX always compiles with XLA.")
@click.option("--min-samples", type=click.IntRange(min=3), default=10, show_default=True,
              help="Least timed samples per cell.")
@click.option("--target-ci", type=click.FloatRange(min=0.001, max=1.0), default=0.05, show_default=True,
              help="Stop sampling when the 95%% CI of the median is within this fraction of it.")
@click.option("--max-cell-seconds", type=click.FloatRange(min=0.01), default=1.5, show_default=True,
              help="Time budget per cell after its minimum samples; cells that run out are marked noisy.")
@click.option("--min-block-ms", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Each sample repeats the call until it lasts this long (amortises dispatch).")
@click.option("--min-span-seconds", type=click.FloatRange(min=0.0), default=2.0, show_default=True,
              help="A cell's samples must spread over this much wall time (drift on shared machines).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for synthetic inputs.")
def profile(**options: Any) -> None:
    """Time every layer of MODEL on each device and batch size; save under profiles/."""
    from tbs.commands.profile_cmd import run_profile

    return run_profile(**options)


@cli.command()
@click.argument("directories", metavar="PROFILE_DIR...", nargs=-1, type=click.Path(path_type=Path))
@click.option("--cost", "prices", type=Prices(), default=None,
              help="Re-price: USD per hour (gpu=3, gpu=3/h) or amortised hardware (cpu=capex:25000/1y).")
@click.option("--spot", type=SpotDiscounts(), default=None, help="Spot/preemptible discount, e.g. tpu=0.7 (70%% off).")
@click.option("--prices", "price_file", type=click.Path(path_type=Path), default=None,
              help="CSV or YAML price list (device, price, source, date).")
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Also show the cost of a workload of N samples.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the HTML report here (self-contained).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "csv"]), default="text", show_default=True,
              help="Terminal output when no -o is given.")
def report(**options: Any) -> None:
    """Report saved profiles (several machines' profiles of one model merge) without measuring."""
    from tbs.commands.report_cmd import run_report

    run_report(**options)


@cli.command()
@click.argument("directory", metavar="PROFILE_DIR", type=click.Path(path_type=Path))
@click.option("--cost", "prices", type=Prices(), default=None, help="Prices (as for tbs report); default: the profile's.")
@click.option("--spot", type=SpotDiscounts(), default=None, help="Spot/preemptible discount, e.g. tpu=0.7.")
@click.option("--objective", type=click.Choice(["cost", "time"]), default="cost", show_default=True)
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=None,
              help="Batch size to place for (default: the largest profiled).")
@click.option("--max-latency", "max_latency_ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --objective cost: at most this many ms per batch.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --objective time: at most this many USD per 1M samples.")
@click.option("--billing", type=click.Choice(["metered", "dedicated"]), default="metered", show_default=True,
              help="metered: pay each device for its busy seconds; dedicated: pay every used device for the whole run.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--verify", is_flag=True, help="Run the placement and the single devices for real; predicted vs measured.")
@click.option("--custom-objects", "custom_files", type=click.Path(path_type=Path), multiple=True,
              help="With --verify: Python file defining the model's custom classes (repeatable).")
def recommend(**options: Any) -> None:
    """Which device each layer should run on, transfers included (exact), against single devices."""
    from tbs.commands.recommend_cmd import run_recommend

    run_recommend(**options)


@cli.command()
@click.option("--backend", "backends", type=click.Choice(BACKENDS), multiple=True,
              help="Only this backend (repeatable). Default: every backend.")
def devices(backends: tuple[str, ...]) -> None:
    """List each backend's devices, and why a backend or device kind is unavailable."""
    from tbs.backend import installed, jax_environment
    from tbs.devices import discover

    jax_environment()
    for name in backends or BACKENDS:
        click.echo(f"{name}:")
        missing = installed(name)
        try:
            found = None if missing else discover(name)
        except Exception as exc:  # a broken install is a reason, not a crash
            missing = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if found is None:
            click.echo(f"  unavailable: {missing}")
            continue
        for device in found.devices:
            memory = f", {device.memory_bytes / 2**30:.1f} GiB" if device.memory_bytes else ""
            click.echo(f"  {device.name:8} {device.kind:4} {device.description}{memory}")
        for kind, reason in found.missing.items():
            click.echo(f"  {kind:8} -    {reason}")


def main() -> None:
    cli(prog_name="tbs")


def install_interrupt_handler(on_first: Any) -> Any:
    """First Ctrl-C: finish the current sample and stop cleanly. Second: stop at once."""
    state = {"count": 0}

    def handler(signum: int, frame: Any) -> None:
        state["count"] += 1
        if state["count"] == 1:
            on_first()
        else:
            raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, handler)
