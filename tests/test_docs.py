"""The docs still match the code: every `tbs` command in README.md and docs/*.md parses against the real CLI.

Fast by design (no model, no framework call, a few seconds): each ``tbs ...`` line of a shell block and
each inline ```tbs ...``` span names a command that exists, only options it has and choices it
accepts; a complete command (no placeholders) is also parsed by click itself, values included, without
running it. Python blocks compile, every ``tbs.name`` the pages use exists, and the commands that need
no model (help, the device catalog, report, recommend and predict on a fake profile) run for real.
"""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import tbs
from conftest import ROOT
from tbs.cli import cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
LABELS = SHELL | {"python", "text"}
# A synopsis's stand-ins: MODEL, PROFILE_DIR, N, FILE.py (a complete command has none of them).
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?")
SEPARATORS = {"&&", "||", ";", "|"}


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def fences(path: Path) -> list[tuple[str, int, list[str]]]:
    """Each fenced block as (its language, the line number of its first line, its lines)."""
    blocks, current = [], None
    for number, line in enumerate(path.read_text().split("\n"), 1):
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            current = (stripped[3:].strip(), number + 1, [])
        elif current is not None and stripped == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    assert current is None, f"{where(path, current[1] - 1)}: a code block that never closes"
    return blocks


def prose(path: Path) -> str:
    """The page with every fenced block's lines blanked, so line numbers still count."""
    lines, inside = path.read_text().split("\n"), False
    for i, line in enumerate(lines):
        fence = line.strip().startswith("```")
        if inside or fence:
            lines[i] = ""
        if fence:
            inside = not inside
    return "\n".join(lines)


def commands_in(text: str) -> list[list[str]]:
    """The arguments after ``tbs`` of every tbs command on one shell line (env settings, ``&&``, comments aside)."""
    found, words = [], shlex.split(text, comments=True)
    segment: list[str] = []
    for word in [*words, "&&"]:
        if word not in SEPARATORS:
            segment.append(word)
            continue
        while segment and re.fullmatch(r"[A-Za-z_]\w*=\S*", segment[0]):
            segment.pop(0)
        if segment and segment[0] == "tbs":
            found.append(segment[1:])
        segment = []
    return found


def shell_commands(path: Path):
    """(place, args, complete) of each tbs command in a shell block; indented lines continue a synopsis."""
    for language, first, lines in fences(path):
        if language not in SHELL:
            continue
        joined: list[tuple[int, str]] = []
        for offset, line in enumerate(lines):
            if joined and (joined[-1][1].endswith("\\") or (line.startswith(" ") and line.strip())):
                joined[-1] = (joined[-1][0], joined[-1][1].rstrip("\\") + " " + line.strip())
            else:
                joined.append((first + offset, line))
        for number, line in joined:
            for args in commands_in(line):
                yield where(path, number), args, False


def inline_commands(path: Path):
    """(place, args, is_inline) of each ```tbs ...``` span in the prose (a span may wrap onto the next line)."""
    text = prose(path)
    for match in re.finditer(r"`([^`]+)`", text):
        span = match.group(1)
        if "\n\n" in span or not re.match(r"(?:[A-Za-z_]\w*=\S*\s+)*tbs\s", span.strip() + " "):
            continue
        number = text.count("\n", 0, match.start()) + 1
        for args in commands_in(span.replace("\n", " ")):
            yield where(path, number), args, True


ALL = [(place, args, inline) for path in DOCS for place, args, inline in
       [*shell_commands(path), *inline_commands(path)] if args]  # `tbs` alone is the tool's name


def test_the_pages_have_commands_to_check():
    assert len(DOCS) >= 10 and (ROOT / "docs" / "README.md") in DOCS
    assert len(ALL) > 40
    assert {args[0] for _, args, _ in ALL} >= {"profile", "report", "recommend", "predict", "devices"}


def test_every_code_block_says_its_language():
    """An unlabelled block would escape the checks below: each is sh (checked), python (compiled) or text."""
    for path in DOCS:
        for language, first, _ in fences(path):
            assert language in LABELS, f"{where(path, first - 1)}: label the code block ({sorted(LABELS)})"


def test_python_blocks_compile():
    blocks = [(path, first, lines) for path in DOCS for language, first, lines in fences(path) if language == "python"]
    assert blocks, "the README's Python example is gone"
    for path, first, lines in blocks:
        try:
            compile("\n" * (first - 1) + "\n".join(lines), str(path.relative_to(ROOT)), "exec")
        except SyntaxError as error:
            pytest.fail(f"{where(path, error.lineno or first)}: {error.msg}")


def _synopsis(args: list[str]) -> list[str]:
    """``[--devices cpu,gpu]`` -> ``--devices cpu,gpu``: brackets say optional, the words stay."""
    return [plain for word in args if (plain := word.replace("[", "").replace("]", ""))]


def _is_complete(args: list[str]) -> bool:
    return not any("[" in w or "..." in w or "|" in w or PLACEHOLDER.fullmatch(w) for w in args)


def _context(command: click.Command, name: str) -> click.Context:
    return click.Context(command, info_name=name, parent=click.Context(cli, info_name="tbs", **cli.context_settings))


def _check_options(command: click.Command, name: str, words: list[str], place: str) -> None:
    """Every option exists on the command, and every choice written for a Choice option is one of its choices."""
    params = {opt: p for p in command.get_params(_context(command, name)) for opt in [*p.opts, *p.secondary_opts]}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and len(word) > 1 and not re.fullmatch(r"-[\d.]+", word):
            option, equals, value = word.partition("=")
            param = params.get(option)
            assert param is not None, f"{place}: `tbs {name}` has no option {option} (its options: {sorted(params)})"
            takes_value = not (getattr(param, "is_flag", False) or getattr(param, "count", False))
            if takes_value and not equals and i + 1 < len(words):
                value, i = words[i + 1], i + 1
            if takes_value and value and isinstance(param.type, click.Choice):
                for choice in value.split("|"):
                    assert PLACEHOLDER.fullmatch(choice) or choice in param.type.choices, \
                        f"{place}: `tbs {name} {option} {choice}`: not one of {list(param.type.choices)}"
        i += 1


@pytest.mark.parametrize("place, args, inline", ALL, ids=[f"{p} tbs {' '.join(a)[:40]}" for p, a, _ in ALL])
def test_command_parses_against_the_cli(place, args, inline):
    if args[0].startswith("-"):  # tbs --help, tbs --version
        _check_options(cli, "tbs", args, place)
        return
    name, rest = args[0], args[1:]
    command = cli.get_command(_context(cli, "tbs"), name)
    assert command is not None, f"{place}: there is no command `tbs {name}` (commands: {sorted(cli.commands)})"
    words = _synopsis(rest)
    _check_options(command, name, words, place)
    if not _is_complete(rest) or any(w in ("-h", "--help") for w in rest):
        return
    try:  # click itself, values and arguments included; nothing runs
        command.make_context(name, list(rest), parent=_context(cli, "tbs"))
    except click.MissingParameter:
        assert inline, f"{place}: `tbs {' '.join(args)}` misses a required argument or option"
    except click.BadOptionUsage as error:  # prose naming an option without its value: `tbs report -o`
        assert inline and rest[-1] == error.option_name, f"{place}: `tbs {' '.join(args)}`: {error.format_message()}"
    except click.ClickException as error:
        pytest.fail(f"{place}: `tbs {' '.join(args)}`: {error.format_message()}")


def test_every_option_of_every_command_is_documented():
    text = "\n".join(path.read_text() for path in DOCS)
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option):  # -o or --output: one of its names is enough
                assert any(re.search(r"(?<![\w-])" + re.escape(o) + r"(?![\w-])", text) for o in param.opts), \
                    f"`tbs {name} {'/'.join(param.opts)}` is in no page of the docs"


def _resolve(dotted: str):
    thing, module = tbs, "tbs"
    for part in dotted.split("."):
        if hasattr(thing, part):
            thing = getattr(thing, part)
        else:
            thing = importlib.import_module(f"{module}.{part}")  # a submodule: tbs.testing, tbs.predictions...
        module = f"{module}.{part}"
    return thing


def test_every_tbs_name_the_docs_use_exists():
    names = {}
    for path in DOCS:
        for match in re.finditer(r"(?<![\w./-])tbs\.([A-Za-z_][\w.]*\w)", path.read_text()):
            names.setdefault(match.group(1), where(path, path.read_text().count("\n", 0, match.start()) + 1))
    assert {"profile", "recommend", "render", "load", "predict", "devices", "verify"} <= set(names)
    for dotted, place in sorted(names.items()):
        try:
            _resolve(dotted)
        except (AttributeError, ImportError):
            pytest.fail(f"{place}: tbs.{dotted} does not exist")


def test_the_headline_table_is_the_same_in_the_readme_and_the_results_page():
    def table(path):
        return path.read_text().split("<!-- results:begin -->", 1)[1].split("<!-- results:end -->", 1)[0]
    assert table(ROOT / "README.md") == table(ROOT / "docs" / "results.md")


def test_relative_links_point_at_files_that_exist():
    for path in DOCS:
        text = prose(path)
        for match in re.finditer(r"\]\(([^)#\s]+)(#[^)\s]*)?\)", text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            assert (path.parent / target).exists(), \
                f"{where(path, text.count(chr(10), 0, match.start()) + 1)}: link to {target}, which does not exist"


@pytest.fixture(scope="module")
def fake(two_device_profile):
    """A finished profile on two fake devices: what report, recommend and predict read."""
    return two_device_profile


def test_commands_that_need_no_model_run(fake, tmp_path):
    copy = shutil.copytree(fake, tmp_path / "copy")  # tbs predict writes predictions.csv beside the profile
    runs = [["--help"], ["--version"], *[[name, "--help"] for name in cli.commands],
            ["devices", "--catalog"],
            ["report", fake], ["report", fake, "--format", "json"], ["report", fake, "--format", "csv"],
            ["report", fake, "--cost", "cpu=capex:25000/1y,gpu=3", "--spot", "gpu=0.7", "--samples", "1000"],
            ["recommend", fake, "--cost", "cpu=0.5,gpu=3"], ["recommend", fake, "--objective", "time", "--format", "json"],
            ["recommend", fake, "--objective", "time", "--billing", "dedicated", "--max-latency", "100"],
            ["predict", copy, "--device", "l4,h100,tpu-v5e"],
            ["diff", fake, copy], ["diff", fake, copy, "--format", "markdown", "--all"],
            ["diff", fake, copy, "--format", "json", "--gate", "model", "--threshold", "5%"]]
    for args in runs:
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, f"tbs {' '.join(map(str, args))}: {result.output}{result.stderr}"
        assert result.output.strip()
