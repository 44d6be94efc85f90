"""Once through a real process: Ctrl-C halfway leaves a usable profile that --resume completes."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from tbs.cli import cli

from tbs.measure.in_context import SUMMARY_IN_MODEL
from tbs.columns import ROOFLINE_COLUMNS

from conftest import FAST, native_log_lines


def _tbs(*args):
    return [sys.executable, "-m", "tbs", *[str(a) for a in args]]


def test_sigint_then_resume(seq_pkl, tmp_path):
    out = tmp_path / "p"
    args = ["profile", seq_pkl, "--out", out, "--batch", "2,4,8,16,32,64", *FAST, "--max-cell-seconds", "0.15",
            "--target-ci", "0.001"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(_tbs(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    summary = out / "summary.csv"
    deadline = time.time() + 120
    while time.time() < deadline and (not summary.exists() or len(summary.read_text().splitlines()) < 4):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "interrupted"
    before = pd.read_csv(summary)
    assert 3 <= len(before) < 18  # some, not all, of 6 batches x 3 layers
    samples_before = pd.read_csv(out / "samples.csv")

    done = CliRunner().invoke(cli, [str(a) for a in (*args, "--resume")])  # the resume: in this process
    assert done.exit_code == 0, done.output
    after = pd.read_csv(summary)
    assert len(after) == 18 and json.loads((out / "metadata.json").read_text())["status"] == "complete"
    # finished cells were not measured again: their rows and raw samples are unchanged
    keys = ["layer", "batch_size"]
    # (the roofline columns are derived from the calibration, and the in-model ones from ops.csv, when the
    # profile is finished or loaded)
    measured = [c for c in before.columns if c not in ROOFLINE_COLUMNS + SUMMARY_IN_MODEL]
    again = before[keys].merge(after, on=keys, how="left")[measured]
    pd.testing.assert_frame_equal(again, before[measured], check_dtype=False)
    finished = set(zip(before["layer"], before["batch_size"]))
    samples_after = pd.read_csv(out / "samples.csv")
    old = samples_before[[k in finished for k in zip(samples_before["layer"], samples_before["batch_size"])]]
    new = samples_after[[k in finished for k in zip(samples_after["layer"], samples_after["batch_size"])]]
    pd.testing.assert_frame_equal(old.reset_index(drop=True), new.reset_index(drop=True), check_dtype=False)
    assert "batch 64" in done.stdout


@pytest.fixture(scope="module")
def two_cpus(two_cpus_run):
    """A profile on two logical CPUs and its ``recommend --verify``, in the tests' two-CPU process
    (conftest.two_cpus_run: logical devices are made at TensorFlow's start): the profile, both commands'
    stdout, and the process's stderr."""
    runs = two_cpus_run["runs"]
    return two_cpus_run["paths"]["seq"], runs[0]["stdout"], two_cpus_run["stderr"], runs[1]["stdout"]


def test_two_logical_devices_profile_side_by_side(two_cpus):
    """Every device gets its own copy of the model and its own cells; the table marks the winners.

    Splitting the host CPU lets none of TensorFlow's native log lines through to the terminal."""
    out, stdout, stderr, _ = two_cpus
    assert native_log_lines(stderr) == []
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary["device"].unique()) == ["cpu:0", "cpu:1"]
    assert len(summary) == 2 * 3
    assert set(summary[summary["device"] == "cpu:1"]["usd_per_hour"]) == {2.0}
    assert "* fastest  $ cheapest" in stdout and "$" in stdout
    assert len(pd.read_csv(out / "model.csv")) == 2
    fits = json.loads((out / "metadata.json").read_text())["transfers"]
    assert set(fits) == {"cpu:0->cpu:1", "cpu:1->cpu:0"}
    assert all(f["alpha_s"] >= 0 and f["beta_s_per_byte"] >= 0 for f in fits.values())
    page = (out / "report.html").read_text()
    assert "Recommended placement" in page and "frontier" in page
    copies = pd.read_csv(out / "transfers.csv")
    assert set(copies["bytes"]) == {4096, 262144, 4194304, 33554432}


def test_recommend_verify_on_two_logical_devices(two_cpus):
    out, _, _, verified = two_cpus
    assert "Verified by running it" in verified and "Verdict:" in verified
    assert "3 of 3 layers ran their ops on the device they were placed on" in verified
    # This process has one logical CPU: the profile's second device is not here.
    missing = CliRunner().invoke(cli, ["recommend", str(out), "--objective", "time", "--verify"])
    assert missing.exit_code == 2 and "not on this machine" in missing.stderr


def _measuring(out):
    """The profile's metadata says running (written once the directory is locked and the run registered)."""
    try:
        return json.loads((out / "metadata.json").read_text()).get("status") == "running"
    except (OSError, ValueError):
        return False


def test_a_second_run_on_a_profile_being_measured_is_refused(seq_pkl, tmp_path):
    """Two runs on one directory would measure the same cells under each other's load: the second stops."""
    out = tmp_path / "p"
    # 50 ms samples, an unreachable CI and 5 s per cell: the first group alone takes about 20 s,
    # and the whole run minutes, unless stopped (it is, below).
    args = ["profile", seq_pkl, "--out", out, "--batch", "2,4,8,16,32,64", *FAST, "--min-block-ms", "50",
            "--max-cell-seconds", "5", "--target-ci", "0.001"]
    first = subprocess.Popen(_tbs(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not _measuring(out):
            time.sleep(0.1)
        second = CliRunner().invoke(cli, [str(a) for a in (*args, "--resume")])  # the lock is per process
        assert second.exit_code == 2, second.output
        assert f"is being measured by tbs process {first.pid}" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
        elsewhere = CliRunner().invoke(cli, ["profile", str(seq_pkl), "--out", str(tmp_path / "q"), "--batch", "2",
                                             *FAST])
        assert elsewhere.exit_code == 0, elsewhere.output
        assert f"another tbs run is measuring on this machine (process {first.pid} measuring {out})" in elsewhere.stderr
    finally:
        first.send_signal(signal.SIGINT)
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stdout[-2000:] + stderr[-2000:]
