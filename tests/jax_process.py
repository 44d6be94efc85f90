"""One JAX process for the JAX tests that need a process of their own (Keras picks its backend once per
process, and the tests' own runs TensorFlow): one JAX start-up for both parts.

1. The CLI on two logical CPUs (``tbs profile --backend jax``, chosen by the flag, KERAS_BACKEND unset): a
   profile of an MLP on both CPUs, one of a string model on cpu:0, and ``recommend --verify`` of the MLP's
   (tests/test_jax_backend.py).
2. Then the backend's phase programs on a Dense layer, a training profile of a branchy model and its
   verification (tests/test_training.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import CLI_RUNS, assert_commands_ran

SCRIPT = CLI_RUNS + r'''
import sys
import time
import numpy as np
from tbs import backends
backends.choose("jax")
keras = backends.keras()
device = backends.discover("jax").devices[0]

def per_call(runner, n=20):  # the best of 5 rounds of n calls in one compiled loop (50 took 2.5x as long)
    runner(n)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter(); runner(n); best = min(best, (time.perf_counter() - start) / n)
    return best

out = {}
for batch in (32, 512):
    dense = keras.layers.Dense(512); dense.build((None, 512))
    x = np.random.rand(batch, 512).astype("float32")
    with_dx = device.training_programs(lambda t: dense(t), [x], dense.variables, [True], keras.optimizers.Adam, False)
    no_dx = device.training_programs(lambda t: dense(t), [x], dense.variables, [False], keras.optimizers.Adam, False)
    out[batch] = dict(forward=per_call(with_dx.forward), backward=per_call(with_dx.backward),
                      backward_no_dx=per_call(no_dx.backward), update=per_call(with_dx.update),
                      residual=with_dx.residual_bytes, slots=with_dx.slot_bytes, weights=with_dx.weight_bytes)
later = device.training_programs(lambda t: dense(t), [x], dense.variables, [False], keras.optimizers.Adam, False,
                                 owned=[False, False])  # a shared layer's later call: its gradients, no update
out["later_call"] = [later.backward is not None, later.update is None, later.weight_bytes, later.slot_bytes]
relu = keras.layers.ReLU()
out["relu"] = device.training_programs(lambda t: relu(t), [np.ones((4, 4), "float32")], [], [False], None, False).backward is None
from tbs.backends.jax.training import pure_call
drop = keras.layers.Dropout(0.5)
pure = pure_call(lambda t: drop(t, training=True), [], list(drop.variables), lambda o: [o])
state = [v.value for v in drop.variables]
_, new_state = pure([], state, np.ones((8, 8), "float32"))
out["seed_advances"] = bool(np.any(np.asarray(new_state[0]) != np.asarray(state[0])))
first, second = backends.discover("jax").devices[:2]  # a split's replay puts every program's inputs on its device
here = first.put(np.ones(3, "float32"))
moved = second.put(here)
out["put"] = [first.put(here) is here, moved is not here, moved.devices() == {second.jax_device},
              second.put(moved) is moved]
import tbs  # the profile and its split-step verification, in the same process (one JAX start-up)
timing = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
p = tbs.profile(job["branchy"], [4], devices=["cpu:0"], training=True, timing=timing, progress=None, report=False,
                out=job["training_out"])
verification = tbs.verify(p, tbs.recommend(p, "time"))
out["verified"] = [verification.placed_right, verification.layers, len(verification.results)]
phases = p.analysis.groupby("phase")["flops"].sum()
out["analysed"] = {k: float(v) for k, v in phases.items()}
out["row_flops"] = float(p.summary["flops"].sum())
out["calibration"] = p.metadata["calibration"]
# The host CPU of a GPU machine (seen on an H200): Keras on JAX takes the cuDNN LSTM whenever the process's
# default backend is a GPU, whatever device it traces for. Make Keras think so, then profile and replay an LSTM on cpu:0.
keras_rnn = sys.modules["keras.src.backend.jax.rnn"]
gpu_available, keras_rnn._is_gpu_available = keras_rnn._is_gpu_available, (lambda: True)
inp = keras.Input((6, 3))
lstm_model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.LSTM(4)(inp)))
lp = tbs.profile(lstm_model, [2], devices=["cpu:0"], timing=timing, progress=None, report=False,
                 out=job["training_out"] + "_lstm")
lv = tbs.verify(lp, tbs.recommend(lp, "time"), model=lstm_model)
out["lstm_in_a_gpu_process"] = [list(lp.summary["status"]), list(lp.model["status"]), lv.placed_right, lv.layers]
keras_rnn._is_gpu_available = gpu_available
print("RESULT" + json.dumps({"cli": runs, "training": out}))
'''


def run(job: dict[str, Any], root: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``job``: the CLI ``commands`` and the ``branchy`` model file and ``training_out`` directory. Each CLI
    command's exit code and output, and the training part's findings."""
    env = dict(os.environ, PYTHONPATH=str(root), TBS_LOGICAL_CPUS="2")
    env.pop("KERAS_BACKEND", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(job)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=root)
    assert done.returncode == 0 and "RESULT" in done.stdout, done.stderr[-3000:]
    found = json.loads(done.stdout.split("RESULT", 1)[1])
    assert_commands_ran(job["commands"], found["cli"])
    return found["cli"], found["training"]
