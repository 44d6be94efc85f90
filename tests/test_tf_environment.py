"""TensorFlow's native log lines stay off the user's terminal when discovery succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import native_log_lines

ROOT = Path(__file__).resolve().parent.parent

DISCOVER = (
    "from tbs.backends import choose, discover; choose('tensorflow'); "
    "found = discover('tensorflow'); print(len([d for d in found.devices if d.kind == 'cpu']))"
)


def _discover_in_subprocess(tmp_path: Path, logical_cpus: str | None = None) -> subprocess.CompletedProcess:
    """A fresh process: TensorFlow's runtime (and its CUDA probe) starts only once per process."""
    env = {k: v for k, v in os.environ.items() if k not in ("TBS_LOGICAL_CPUS", "TF_CPP_MIN_LOG_LEVEL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if logical_cpus is not None:
        env["TBS_LOGICAL_CPUS"] = logical_cpus
    return subprocess.run([sys.executable, "-c", DISCOVER], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_plain_discovery_lets_no_native_line_through(tmp_path):
    """(With the host CPU split in two: tests/test_subprocess.py's two-device profile.)"""
    done = _discover_in_subprocess(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert native_log_lines(done.stderr) == []


def test_held_back_native_output_is_replayed_when_the_block_fails(capfd):
    from tbs.backends.host import native_stderr_captured

    with native_stderr_captured():
        os.write(2, b"probe chatter\n")
    assert "probe chatter" not in capfd.readouterr().err
    with pytest.raises(RuntimeError), native_stderr_captured():
        os.write(2, b"the real cause\n")
        raise RuntimeError("failed")
    assert "the real cause" in capfd.readouterr().err


QUIET_PROFILE = r'''
import numpy as np
import tensorflow as tf  # the user's own import, before tbs: tbs did not import TensorFlow
import keras
import tbs

model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="d"), keras.layers.Dense(3, name="head")])
timing = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
for training in (False, True):
    tbs.profile(model, [4], training=training, timing=timing, progress=None, report=False, measure=tbs.MeasureConfig(analysis=False))
print("DONE")
'''


def test_profile_from_python_after_importing_tensorflow_prints_no_environment_and_no_tf_warning(tmp_path):
    """AutoGraph converts what traced code calls: an os.environ call in it printed every variable to stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               KERAS_BACKEND="tensorflow", TBS_TEST_SECRET="do-not-print-me-4417")
    done = subprocess.run([sys.executable, "-c", QUIET_PROFILE], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]
    assert "do-not-print-me-4417" not in done.stderr and "environ(" not in done.stderr
    assert "WARNING:tensorflow" not in done.stderr, done.stderr[-3000:]  # AutoGraph, retracing: not the user's
