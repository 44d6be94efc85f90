"""Click plumbing for tbs: one-line errors with exit code 2, warnings as lines, option types."""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import click

from tbs.errors import TbsError, TbsWarning

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _fail(message: str) -> None:
    click.echo(f"Error: {' '.join(str(message).split())}", err=True)
    sys.exit(EXIT_USAGE)


def _warning_printer(previous: Callable[..., None]) -> Callable[..., None]:
    """tbs's own warnings are one ``Warning:`` line each; anything else as Python shows it."""

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if issubclass(category, TbsWarning):
            click.echo(f"Warning: {message}", err=True)
        else:
            previous(message, category, filename, lineno, file, line)

    return show


class TbsGroup(click.Group):
    """A click group whose errors are one line on stderr, exit code 2, no traceback."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("always", TbsWarning)
            warnings.showwarning = _warning_printer(warnings.showwarning)
            return self._main(args, prog_name, complete_var, **extra)

    def _main(self, args: Any, prog_name: Any, complete_var: Any, **extra: Any) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `tbs`: help, as any CLI would
            click.echo(exc.ctx.get_help() if exc.ctx else "")
            sys.exit(0)
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


class Parsed(click.ParamType):
    """An option value parsed by one of tbs's parsers (whose errors are already one line)."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        return value if isinstance(value, (dict, list)) else self.parse(str(value))


class Percent(click.ParamType):
    """A percentage, written 10 or 10%; the value is the fraction (0.1)."""

    name = "PERCENT"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            number = float(text[:-1] if text.endswith("%") else text)
        except ValueError:
            self.fail(f"'{value}' is not a percentage; write e.g. 10% (or 10)", param, ctx)
        if not 0 <= number < 10000:
            self.fail(f"{value} is not a percentage from 0 up; write e.g. 10%", param, ctx)
        return number / 100.0


def dataset_size_options(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--dataset-size N``, and ``--samples N``: its old name, still accepted (``pick_dataset_size`` merges them)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option("--samples", "old_samples", type=click.IntRange(min=1), default=None, metavar="N",
                               help="Old name of --dataset-size, still accepted (says so on stderr).")(command)
        return click.option("--dataset-size", "dataset_size", type=click.IntRange(min=1), default=None, metavar="N",
                            help=help)(command)

    return decorate


def pick_dataset_size(given: int | None, old_samples: int | None) -> int | None:
    """The dataset size from --dataset-size or its old name --samples (with a note), refusing both at once."""
    if old_samples is None:
        return given
    if given is not None:
        raise TbsError("--samples is the old name of --dataset-size: give one of them")
    click.echo("Note: --samples is the old name of --dataset-size (the dataset's size); it still works.", err=True)
    return old_samples

