"""A damaged profile is never drawn, summed or deleted: one line naming the file and line, or a cut row dropped.

Profiles here come from the real profiler and store on fake devices (no framework), and are
read back through the real CLI (click's CliRunner), as a user's commands would.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST
from tbs.cli import cli
from tbs.testing import FakeClock, FakeDevice, chain, fake_profile

LAYERS = ("dense", "dense_1")


def _make(directory: Path, resume: bool = False):
    clock = FakeClock()
    device = FakeDevice("cpu", 0, clock, {"dense": lambda b: 1e-5 * b, "dense_1": lambda b: 2e-5 * b})
    return fake_profile(directory, chain(*LAYERS), [device], batch_sizes=(8, 64), resume=resume)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("damage") / "p"
    _make(directory)
    return directory


@pytest.fixture
def profile_dir(pristine, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(pristine, tmp_path / "p"))


def _set(path: Path, row: int, column: str, value: str) -> None:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame.loc[row, column] = value
    frame.to_csv(path, index=False)


def _run(*args) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, [str(a) for a in args])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return done.exit_code, done.stdout, done.stderr


DAMAGE = [  # (file, row, column, value, what the one line says)
    ("summary", 0, "median_s", "fast", "line 2: median_s 'fast' is not a number"),
    ("summary", 1, "median_s", "-0.25", "line 3: median_s -0.25 is below 0, impossible for a time"),
    ("summary", 0, "median_s", "nan", "line 2: status ok but median_s is blank"),
    ("summary", 2, "median_s", "inf", "line 4: median_s inf is not a finite number"),
    ("summary", 0, "batch_size", "2.5", "line 2: batch_size 2.5 is not a whole number"),
    ("summary", 1, "status", "great", "line 3: status 'great' is not one of ok, noisy"),
    ("summary", 0, "device", "", "line 2: device is blank"),
    ("model", 1, "median_s", "-1e-3", "model.csv' line 3: median_s -1e-3 is below 0"),
    ("samples", 4, "raw_seconds", "x", "samples.csv' line 6: raw_seconds 'x' is not a number"),
]


@pytest.mark.parametrize("name, row, column, value, message", DAMAGE)
def test_a_damaged_value_is_one_line_naming_file_and_line_in_every_command(profile_dir, name, row, column, value,
                                                                          message):
    _set(profile_dir / f"{name}.csv", row, column, value)
    for command in (["report", profile_dir], ["report", profile_dir, "--format", "csv"],
                    ["recommend", profile_dir, "--objective", "time"], ["predict", profile_dir, "--device", "t4"]):
        code, stdout, stderr = _run(*command)
        assert code == 2 and stdout == "", command
        assert stderr.count("\n") == 1 and f"{name}.csv" in stderr and message in stderr, (command, stderr)


METADATA_DAMAGE = [  # (key, damaged value, what the one line says)
    ("capacity", "abc", "key capacity is 'abc', not a JSON object"),
    ("capacity", {"cpu:0": {"largest_batch": "many"}}, "key capacity['cpu:0'].largest_batch is 'many', not a whole number"),
    ("transfers", {"cpu:0->cpu:1": {"alpha_s": "x"}}, "key transfers['cpu:0->cpu:1'].alpha_s is 'x', not a number"),
    ("batch_sizes", [8, "64"], "key batch_sizes[1] is '64', not a whole number"),
    ("xla", "no", "key xla is 'no', not true or false"),
    ("devices", {"cpu:0": 1}, "key devices is {'cpu:0': 1}, not a list"),
]


@pytest.mark.parametrize("key, value, message", METADATA_DAMAGE)
def test_a_damaged_metadata_value_is_one_line_naming_file_and_key(profile_dir, key, value, message):
    path = profile_dir / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata[key] = value
    path.write_text(json.dumps(metadata))
    for command in (["report", profile_dir], ["recommend", profile_dir, "--objective", "time"]):
        code, stdout, stderr = _run(*command)
        assert code == 2 and stdout == "", (command, stderr)
        assert stderr.count("\n") == 1 and "metadata.json" in stderr and message in stderr, (command, stderr)


def test_a_garbage_row_appended_is_refused_not_shown(profile_dir):
    with open(profile_dir / "summary.csv", "a") as handle:
        handle.write("garbage,row,here\n")
    code, stdout, stderr = _run("recommend", profile_dir, "--objective", "time")
    assert code == 2 and "summary.csv' line 6: device is blank; batch_size is blank" in stderr
    code, stdout, _ = _run("report", profile_dir, "--format", "csv")
    assert code == 2 and "garbage" not in stdout


def test_batch_sizes_stay_whole_numbers_in_csv_output(profile_dir):
    code, stdout, _ = _run("report", profile_dir, "--format", "csv")
    assert code == 0
    assert set(pd.read_csv(pd.io.common.StringIO(stdout), dtype=str)["batch_size"]) == {"8", "64"}


@pytest.mark.parametrize("name", ["summary", "model", "samples"])
def test_a_last_row_cut_short_is_dropped_with_a_warning_and_resume_measures_it_again(profile_dir, name):
    path = profile_dir / f"{name}.csv"
    text = path.read_text()
    lines = text.splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # cut mid-row, no line end
    code, stdout, stderr = _run("report", profile_dir, "--format", "csv")
    assert code == 0 and f"{name}.csv' line {len(lines)} was cut short" in stderr
    if name == "summary":
        assert len(pd.read_csv(pd.io.common.StringIO(stdout))) == len(lines) - 2  # the cut row is not shown
    meta = json.loads((profile_dir / "metadata.json").read_text())
    (profile_dir / "metadata.json").write_text(json.dumps(dict(meta, status="interrupted")))
    with pytest.warns(UserWarning, match="cut short"):
        resumed = _make(profile_dir, resume=True)
    assert resumed.complete and path.read_text().endswith("\n")
    summary, model = resumed.summary, resumed.model
    assert len(summary) == 4 and not summary.duplicated(["layer", "batch_size"]).any()
    assert len(model) == 2 and not model.duplicated(["batch_size"]).any()
    samples = resumed.samples
    assert not samples.duplicated(["target", "layer", "batch_size", "sample", "phase"]).any()


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def _profile(seq_pkl, out, *extra):
    """``tbs profile`` through the CLI in this process (TensorFlow is loaded once for the module)."""
    done = CliRunner().invoke(cli, [str(a) for a in ["profile", seq_pkl, "--out", out, *FAST, *extra]])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exception
    return subprocess.CompletedProcess(done, done.exit_code, done.stdout, done.stderr)


def test_a_cut_metadata_json_is_refused_or_rebuilt_and_never_deletes_a_row(seq_pkl, tmp_path):
    out = tmp_path / "p"
    assert _profile(seq_pkl, out, "--batch", "2,4").returncode == 0
    meta = (out / "metadata.json").read_text()
    (out / "metadata.json").write_text(meta[: len(meta) // 3])  # cut short
    before = _digest(out)
    refused = _profile(seq_pkl, out, "--batch", "2,4,8")
    assert refused.returncode == 2 and "metadata.json is damaged or missing; add --resume" in refused.stderr
    assert "Traceback" not in refused.stderr and _digest(out) == before  # every file as it was
    rows = pd.read_csv(out / "summary.csv")
    done = _profile(seq_pkl, out, "--batch", "2,4,8", "--resume")
    assert done.returncode == 0, done.stderr
    assert "metadata.json was rebuilt from 6 layer rows and 2 model rows" in done.stderr
    after = pd.read_csv(out / "summary.csv")
    assert len(after) == 9 and not after.duplicated(["layer", "batch_size"]).any()
    same = rows.merge(after, on=["layer", "batch_size"], suffixes=("", "_after"))
    assert len(same) == 6 and (same["median_s"] == same["median_s_after"]).all()  # kept, not measured again
    assert (out / "metadata.json.damaged").read_text() == meta[: len(meta) // 3]
    rebuilt = json.loads((out / "metadata.json").read_text())
    assert rebuilt["status"] == "complete" and "could not be checked" in rebuilt["rebuilt"]


def test_profiling_again_into_a_finished_profile_moves_it_aside(seq_pkl, tmp_path):
    out = tmp_path / "p"
    assert _profile(seq_pkl, out, "--batch", "2").returncode == 0
    first = pd.read_csv(out / "summary.csv")
    again = _profile(seq_pkl, out, "--batch", "4")
    assert again.returncode == 0, again.stderr
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("p.previous-")]
    assert len(moved) == 1 and f"moved to {moved[0]}" in again.stderr
    pd.testing.assert_frame_equal(pd.read_csv(moved[0] / "summary.csv"), first)
    assert set(pd.read_csv(out / "summary.csv")["batch_size"]) == {4}
