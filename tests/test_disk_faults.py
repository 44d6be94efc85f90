"""Real faults, through real processes: a disk that fills mid-run, a read-only mount, a SIGKILL.

The disks are real: a tiny tmpfs and a read-only bind mount, made in a private mount
namespace (``unshare``; as root, or as a user where user namespaces are allowed), so nothing
on the machine changes. Each mount lives as long as one process, which mounts, runs the commands
(one TensorFlow start-up for all of them) and copies out what the assertions read. Skipped where
no mount namespace can be made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import FAST, ROOT
from tbs.cli import cli

BATCHES = "1,2,3,4,5,6,7,8,9,10,11,12"
CELLS = 12 * 3  # batch sizes x layers of the tiny sequential model (dense, dropout, dense_1)


def _namespace() -> list[str] | None:
    """The unshare command that gives a private mount namespace here, or None."""
    if shutil.which("unshare") is None:
        return None
    for command in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
        try:
            probe = subprocess.run([*command, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null "
                                    "|| mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return command
    return None


NAMESPACE = _namespace()
needs_mounts = pytest.mark.skipif(NAMESPACE is None, reason="no private mount namespace here (unshare)")


STEPS_SCRIPT = r"""
import json, pathlib, subprocess, sys, traceback
from click.testing import CliRunner
from tbs.cli import cli
out = pathlib.Path(sys.argv[2])
for kind, name, what in json.loads(sys.argv[1]):
    if kind == "sh":
        subprocess.run(what, shell=True, check=True)
        continue
    if kind == "cli":
        run = CliRunner().invoke(cli, what)
        code, stdout, stderr = run.exit_code, run.stdout, run.stderr
        if run.exception is not None and not isinstance(run.exception, SystemExit):  # a crash, as a process shows it
            stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(run.exception))
    else:
        code, stdout, stderr = 0, "", ""
        try:
            exec(what)
        except Exception:
            code, stderr = 1, traceback.format_exc()
    for suffix, text in (("out", stdout), ("err", stderr), ("rc", str(code))):
        (out / f"{name}.{suffix}").write_text(text)
"""


def _steps_in_namespace(steps: list[tuple[str, str, object]], out: Path) -> subprocess.CompletedProcess:
    """Shell steps (mounts, copies), CLI commands and Python in one process in a private mount namespace:
    one TensorFlow start-up for every command. Each command's output goes to out/NAME.{out,err,rc}."""
    steps = [(kind, name, [str(a) for a in what] if kind == "cli" else what) for kind, name, what in steps]
    return subprocess.run([*NAMESPACE, sys.executable, "-c", STEPS_SCRIPT, json.dumps(steps), str(out)],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          cwd=ROOT)


def _tbs(*args) -> list[str]:
    return [sys.executable, "-m", "tbs", *[str(a) for a in args]]


def _in_process(*args):
    """The CLI in this process (TensorFlow already started): where no real fault needs a process of its own."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def _one_line(stderr: str) -> str:
    """The single error line (progress lines and warnings aside); fails on a traceback."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _each_cell_once(directory: Path) -> pd.DataFrame:
    summary = pd.read_csv(directory / "summary.csv")
    assert not summary.duplicated(["layer", "device", "batch_size"]).any()
    assert len(summary) == CELLS and set(summary["status"]) <= {"ok", "noisy"}
    model = pd.read_csv(directory / "model.csv")
    assert len(model) == 12 and not model.duplicated(["device", "batch_size"]).any()
    assert json.loads((directory / "metadata.json").read_text())["status"] == "complete"
    return summary


@needs_mounts
def test_a_disk_that_fills_mid_run_keeps_every_row_and_resume_finishes_on_it_or_on_a_copy(seq_pkl, tmp_path):
    mnt, out = tmp_path / "disk", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    profile = ["profile", seq_pkl, "--out", mnt / "p", "--batch", BATCHES, *FAST]
    done = _steps_in_namespace([
        ("sh", "", f"mount -t tmpfs -o size=320k tmpfs {mnt}"),
        ("sh", "", f"head -c 218000 /dev/zero > {mnt}/filler"),  # leaves room for part of the profile only
        ("cli", "run1", profile),
        ("sh", "", f"cp -r {mnt}/p {out}/copy"),  # the interrupted profile, as the full disk left it
        ("sh", "", f"rm {mnt}/filler"),  # the user makes room
        ("cli", "run2", [*profile, "--resume"]),
        ("sh", "", f"cp -r {mnt}/p {out}/after"),
    ], out)
    assert done.returncode == 0, done.stderr
    assert (out / "run1.rc").read_text().strip() == "2"
    line = _one_line((out / "run1.err").read_text())
    assert "no space left on the device" in line and "--resume" in line
    meta = json.loads((out / "copy" / "metadata.json").read_text())
    assert meta["status"] == "interrupted" and "no space left" in meta["error"]
    kept = pd.read_csv(out / "copy" / "summary.csv")
    assert 0 < len(kept) < CELLS  # it filled mid-run: some cells measured, not all
    # On the same disk, with room made: finished, nothing measured twice, nothing lost.
    assert (out / "run2.rc").read_text().strip() == "0", (out / "run2.err").read_text()
    after = _each_cell_once(out / "after")
    same = kept.merge(after, on=["layer", "batch_size"], suffixes=("", "_after"))
    assert len(same) == len(kept) and (same["median_s"] == same["median_s_after"]).all()  # kept, not re-measured
    # Or on a copy on another disk.
    resumed = _in_process("profile", seq_pkl, "--out", out / "copy", "--batch", BATCHES, *FAST, "--resume")
    assert resumed.exit_code == 0, resumed.output
    _each_cell_once(out / "copy")


@needs_mounts
def test_a_read_only_disk_is_one_line_everywhere_tbs_writes(seq_pkl, tmp_path):
    profile_dir, ro, out = tmp_path / "p", tmp_path / "ro", tmp_path / "out"
    with_analysis = [a for a in FAST if a != "--no-analysis"]  # predict needs the device's calibration
    made = _in_process("profile", seq_pkl, "--out", profile_dir, "--batch", "2", *with_analysis)
    assert made.exit_code == 0, made.output
    ro.mkdir()
    out.mkdir()
    done = _steps_in_namespace([
        ("sh", "", f"mount --bind {profile_dir} {ro}"),
        ("sh", "", f"mount -o remount,bind,ro {ro}"),
        ("cli", "predict", ["predict", ro, "--device", "t4"]),
        ("cli", "report", ["report", ro, "-o", ro / "r.html"]),
        ("cli", "profile", ["profile", seq_pkl, "--out", ro / "new", "--batch", "2", *FAST]),
        ("py", "save", f"import tbs; tbs.load({str(profile_dir)!r}).save({str(ro / 'saved')!r})"),
    ], out)
    assert done.returncode == 0, done.stderr
    for name in ("predict", "report", "profile"):
        assert (out / f"{name}.rc").read_text().strip() == "2", (name, (out / f"{name}.err").read_text())
        assert "read-only file system" in _one_line((out / f"{name}.err").read_text()), name
    assert "StorageError: cannot write" in (out / "save.err").read_text()  # Python: one TbsError, no OSError
    assert "OSError" not in (out / "save.err").read_text()
    assert not list(profile_dir.glob("*.tmp"))


def test_sigkill_then_a_row_cut_short_resumes_with_every_cell_once(seq_pkl, tmp_path):
    """A real SIGKILL mid-run, then the last samples row cut mid-field as a full disk would leave it."""
    out = tmp_path / "p"
    args = ["profile", seq_pkl, "--out", out, "--batch", BATCHES, *FAST]
    proc = subprocess.Popen(_tbs(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    summary = out / "summary.csv"
    deadline = time.time() + 120
    while time.time() < deadline and (not summary.exists() or len(summary.read_text().splitlines()) < 6):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert json.loads((out / "metadata.json").read_text())["status"] == "running"  # it never got to say more
    kept = pd.read_csv(summary)
    samples = out / "samples.csv"
    text = samples.read_text()
    samples.write_text(text[:text.rstrip("\n").rfind("\n") + 1] + "layer,o")  # the last row cut short
    report = _in_process("report", out)
    assert report.exit_code == 0 and report.exception is None, report.output
    assert "samples.csv' line" in report.stderr and "cut short" in report.stderr
    resumed = _in_process(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    after = _each_cell_once(out)
    assert set(zip(kept["layer"], kept["batch_size"])) <= set(zip(after["layer"], after["batch_size"]))
    assert samples.read_text().endswith("\n") and "layer,o\n" not in samples.read_text()
