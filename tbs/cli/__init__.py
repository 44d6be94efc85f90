"""The tbs command line: a thin layer over the Python API (``tbs.api``)."""

from tbs.cli.commands import cli, main

__all__ = ["cli", "main"]
