"""tbs on a machine without TensorFlow (the GPU machines have JAX and no TensorFlow): every command on --backend jax.

One real process in which an import hook refuses ``tensorflow`` as if it were not installed: it builds
an example model with models/build.py (no KERAS_BACKEND given: it must pick JAX by itself), then runs
``tbs profile --backend jax`` for inference and training, ``report`` (text, JSON, HTML), ``recommend``,
``predict`` and ``devices`` through the CLI, and checks that TensorFlow never got imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI_RUNS, FAST, ROOT

pytest.importorskip("jax", reason="JAX is not installed (pip install 'tbs[jax]')")

BLOCK_TENSORFLOW = r"""
import sys

class NoTensorFlow:
    '''Refuse tensorflow as a machine without it does: ModuleNotFoundError, from find_spec too.'''
    tried = 0

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            NoTensorFlow.tried += 1
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTensorFlow())
"""

SCRIPT = BLOCK_TENSORFLOW + r"""
import json, runpy
job = json.loads(sys.argv[1])
argv, sys.argv = sys.argv, ["build.py", "nn_twins", "--out-dir", job["models"]]
try:
    runpy.run_path(job["build"], run_name="__main__")
except SystemExit as stop:
    assert not stop.code, stop.code
sys.argv = argv
""" + CLI_RUNS + r"""
import keras
print("RESULT" + json.dumps({"runs": runs, "backend": keras.backend.backend(),
                             "tensorflow_loaded": "tensorflow" in sys.modules}))
"""


@pytest.mark.slow
def test_every_command_runs_on_jax_without_tensorflow(tmp_path: Path) -> None:
    model, inference, training = tmp_path / "nn_twins.pkl", tmp_path / "inference", tmp_path / "training"
    analysed = [flag for flag in FAST if flag != "--no-analysis"]  # XLA's cost analysis runs, and predict needs it
    commands = [
        ["profile", str(model), "--backend", "jax", "--devices", "cpu", "--batch", "4", "--cost", "cpu=0.5",
         "--out", str(inference), *analysed],
        ["profile", str(model), "--backend", "jax", "--devices", "cpu", "--batch", "4", "--training",
         "--out", str(training), *FAST],
        ["report", str(inference)],
        ["report", str(inference), "--format", "json"],
        ["report", str(inference), str(training), "-o", str(tmp_path / "both.html")],
        ["recommend", str(inference)],
        ["predict", str(inference), "--device", "h100"],
        ["devices"],
    ]
    job = {"build": str(ROOT / "models" / "build.py"), "models": str(tmp_path), "commands": commands}
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TBS_LOGICAL_CPUS")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(job)], capture_output=True, text=True,
                          env=dict(env, PYTHONPATH=str(ROOT)), timeout=300, cwd=ROOT)
    assert done.returncode == 0 and "RESULT" in done.stdout, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    for command, run in zip(commands, result["runs"]):
        assert run["code"] == 0, (command[:2], run["stdout"][-2000:], run["stderr"][-2000:])
    assert result["backend"] == "jax" and not result["tensorflow_loaded"]
    meta = json.loads((training / "metadata.json").read_text())
    assert meta["backend"] == "jax" and meta["training"]
    assert (tmp_path / "both.html").stat().st_size > 0
    assert "h100" in result["runs"][6]["stdout"]
    assert "tensorflow" in result["runs"][7]["stdout"]  # the devices listing says why TensorFlow is missing
