"""Shared fixtures: tiny real Keras models of every shape, saved the way users save them.

Nothing here imports Keras at collection: the models are built in ``keras_models`` when a
fixture asks for one, so tests of fakes and renderers run without starting TensorFlow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

# Where the environment sets PYTHONDONTWRITEBYTECODE (this project's machines do), every process the tests start
# (about 60, each importing TensorFlow, JAX or Ray) compiled its imports from source again: 18 s a start against
# 5 s with the bytecode Python caches beside the sources. The tests' processes, and this one, write and reuse it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Run argv[1]'s CLI commands (a list, or a job's "commands") through CliRunner: ``runs`` holds each one's
# exit code and output. CLI_SCRIPT prints them; tests/jax_process.py goes on in the same process.
CLI_RUNS = r"""
import json, sys
from click.testing import CliRunner
from tbs.cli import cli
job = json.loads(sys.argv[1])
runs = [CliRunner().invoke(cli, args) for args in (job["commands"] if isinstance(job, dict) else job)]
runs = [{"code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr} for r in runs]
"""
CLI_SCRIPT = CLI_RUNS + 'print("RESULT" + json.dumps(runs))\n'


def assert_commands_ran(commands: list[list[str]], runs: list[dict]) -> None:
    """Every command exited 0; the first that did not, with its output."""
    for command, run in zip(commands, runs):
        assert run["code"] == 0, (command[:2], run["stdout"][-2000:], run["stderr"][-2000:])


def cli_in_one_process(commands: list[list[str]], env: dict[str, str], then: str = "") -> tuple[list[dict], str, Any]:
    """Run CLI commands one after another in one fresh process (one framework start-up, where a test
    needs a process of its own: a backend, logical devices), then the Python code ``then`` (which may set
    ``found``); each command's exit code and output, the process's own stderr (native log lines land there, not
    in the commands' captured output), and ``found``."""
    import json
    import subprocess

    script = CLI_RUNS + then + '\nprint("RESULT" + json.dumps({"runs": runs, "found": globals().get("found")}))\n'
    done = subprocess.run([sys.executable, "-c", script, json.dumps(commands)], capture_output=True, text=True,
                          env=dict(env, PYTHONPATH=str(ROOT)), timeout=300, cwd=ROOT)
    assert done.returncode == 0 and "RESULT" in done.stdout, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert_commands_ran(commands, result["runs"])
    return result["runs"], done.stderr, result["found"]


# A train step split over the two logical CPUs (tests/test_training.py): each MatMul of its graph and its device.
SPLIT_STEP = r'''
import numpy as np
from tbs import backends
keras = backends.keras()
import tensorflow as tf
from tbs.backends.base import PlacedStep
from tbs.backends.tensorflow.split import _placed
from tbs.capture.recorder import capture
cpu0, cpu1 = backends.discover("tensorflow").devices[:2]
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="a"), keras.layers.Dense(4, name="b")])
x = tf.constant(np.random.rand(8, 16).astype("float32"))
calls = capture(model, x, True).calls
steps = [PlacedStep("a", calls[0], cpu0, [("/input", 0)], [False]), PlacedStep("b", calls[1], cpu1, [("a", 0)], [True])]

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        y = _placed(steps[1], [_placed(steps[0], [x])[0]])[0]
        value = tf.reduce_sum(y)
    return tape.gradient(value, model.trainable_variables)

graph = step.get_concrete_function(x).graph
found = [[op.type, op.device] for op in graph.get_operations() if op.type == "MatMul"]
'''


@pytest.fixture(scope="session")
def two_cpus_run(seq_pkl: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tests' one process on two logical CPUs (TensorFlow makes them at its start): the tiny sequential
    model's profile and its ``recommend --verify`` (test_subprocess.py); the endpoint-named model profiled for
    inference and for training, each recommended and verified (test_endpoints.py); then a train step split over
    both CPUs (test_training.py). Where each profile is, each command's run, the process's stderr, the step's
    MatMuls."""
    from keras_models import _pickle, named_model

    root = tmp_path_factory.mktemp("two_cpus")
    paths = {"seq": root / "seq", "named": root / "named", "named_training": root / "named_training"}
    named = _pickle(named_model(), root / "named.pkl")
    commands = [["profile", str(seq_pkl), "--out", str(paths["seq"]), "--batch", "4", *FAST, "--cost",
                 "cpu:0=1,cpu:1=2"],
                ["recommend", str(paths["seq"]), "--objective", "time", "--verify"],
                ["profile", str(named), "--out", str(paths["named"]), "--batch", "8", *FAST],
                ["recommend", str(paths["named"]), "--objective", "time", "--format", "json"],
                ["recommend", str(paths["named"]), "--objective", "time", "--verify"],
                ["profile", str(named), "--out", str(paths["named_training"]), "--batch", "8", "--training", *FAST],
                ["recommend", str(paths["named_training"]), "--objective", "time", "--verify"]]
    runs, stderr, matmuls = cli_in_one_process(commands, dict(os.environ, TBS_LOGICAL_CPUS="2"), SPLIT_STEP)
    return {"paths": paths, "runs": runs, "stderr": stderr, "split_step_matmuls": matmuls}


@pytest.fixture(scope="session")
def jax_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The JAX tests' one JAX process (tests/jax_process.py): its CLI runs, its training findings, and where
    it wrote what. Skipped without JAX."""
    pytest.importorskip("jax", reason="JAX is not installed (pip install 'tbs[jax]')")
    import jax_process
    from keras_models import _pickle, branchy_model, fusion_model, mlp_model, text_model

    root = tmp_path_factory.mktemp("jax")
    paths = {"mlp": _pickle(mlp_model(), root / "mlp.pkl"), "text": _pickle(text_model(), root / "text.pkl"),
             "branchy": _pickle(branchy_model(), root / "branchy.pkl"), "mlp_jax": root / "mlp_jax",
             "fusion": _pickle(fusion_model(), root / "fusion.pkl"), "fusion_jax": root / "fusion_jax",
             "text_jax": root / "text_jax", "training_out": root / "p"}
    commands = [
        # JAX's analysis: the training profile below and test_analysis.py; each Dense measured on its
        # own, so Σ against the whole is three measurements, not one.
        ["profile", str(paths["mlp"]), "--backend", "jax", "--batch", "32", "--cost", "cpu:0=1,cpu:1=2", "--out",
         str(paths["mlp_jax"]), "--min-samples", "5", "--max-cell-seconds", "0.3", "--min-span-seconds", "0",
         "--no-analysis", "--no-dedupe"],
        ["profile", str(paths["text"]), "--backend", "jax", "--batch", "4", "--devices", "cpu:0", "--out",
         str(paths["text_jax"]), *FAST],
        ["recommend", str(paths["mlp_jax"]), "--objective", "time", "--verify"],
        # In-context attribution on JAX (tests/test_in_context.py): a model whose XLA fusions are known.
        ["profile", str(paths["fusion"]), "--backend", "jax", "--batch", "4", "--devices", "cpu:0", "--out",
         str(paths["fusion_jax"]), *FAST],
    ]
    runs, training = jax_process.run({"commands": commands, "branchy": str(paths["branchy"]),
                                      "training_out": str(paths["training_out"])}, ROOT)
    return {"paths": paths, "cli": runs, "training": training}


def native_log_lines(stderr: str) -> list[str]:
    """TensorFlow's native log lines (and the CUDA probe's) in a process's stderr: none may reach a user."""
    return [line for line in stderr.splitlines() if "cuInit" in line or line.startswith(("E0000", "W0000", "I0000"))]


# Fast statistics for tests: the method is the same, the budgets are tiny. The compiler's analysis
# has tests of its own (test_analysis.py, the JAX profiles); elsewhere it would only add time.
FAST = ["--min-samples", "3", "--max-cell-seconds", "0.05", "--min-block-ms", "1", "--min-span-seconds", "0",
        "--no-analysis"]

CUSTOM_LAYER_SOURCE = '''
import keras


class Doubler(keras.layers.Layer):
    def call(self, x):
        return x * 2.0


class TinySubclassed(keras.Model):
    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)
        self.double = Doubler()
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.double(self.dense(x)))

    def get_config(self):
        return {**super().get_config(), "units": self.units}
'''


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def seq_pkl(model_dir: Path) -> Path:
    from keras_models import _pickle, sequential_model

    return _pickle(sequential_model(), model_dir / "tiny_seq.pkl")


@pytest.fixture(scope="session")
def branchy_keras(model_dir: Path) -> Path:
    from keras_models import branchy_model

    path = model_dir / "branchy.keras"
    branchy_model().save(path)
    return path


@pytest.fixture(scope="session")
def custom_source(model_dir: Path) -> Path:
    path = model_dir / "my_layers.py"
    path.write_text(CUSTOM_LAYER_SOURCE)
    return path


@pytest.fixture(scope="session")
def subclassed_pkl(model_dir: Path, custom_source: Path) -> Path:
    from keras_models import _pickle, keras
    from tbs.load.model import import_custom_objects

    classes = import_custom_objects([custom_source])
    model = classes["TinySubclassed"](units=4)
    model(keras.ops.zeros((2, 5)))
    return _pickle(model, model_dir / "subclassed.pkl")


@pytest.fixture(scope="session")
def two_device_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished profile of two Dense layers on a fake CPU and GPU at batch 8 (no framework): read it, or copy
    it before writing into it."""
    from tbs.testing import FakeClock, FakeDevice, chain, fake_profile

    directory = tmp_path_factory.mktemp("fake") / "p"
    clock = FakeClock()
    devices = [FakeDevice(kind, 0, clock, {"dense": 1e-4, "dense_1": 2e-4}) for kind in ("cpu", "gpu")]
    fake_profile(directory, chain("dense", "dense_1"), devices, batch_sizes=(8,))
    return directory
