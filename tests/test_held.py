"""A batch too large for one eager capture is measured in parts sized by what each cell holds.

The eager capture keeps every activation of the batch at once; a layer cell holds its own
inputs (and, while it runs, its outputs and temporaries), the whole model what its compiled
program makes. Real TensorFlow on a tiny chain of Dense layers, with the host's headroom set
for the test (``memory_headroom_bytes``), and one real process under a data-size limit.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tbs.measure import held

FAST = dict(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)
KIB = 1024


def test_parts_hold_their_inputs_and_one_running_call_and_a_cell_too_big_alone_is_set_apart():
    needs = {f"l{i}": held.Need(100.0, 50.0, "compiler") for i in range(5)}
    needs["huge"] = held.Need(500.0, 400.0, "tensors")
    found = held.plan(needs, free_bytes=800.0)  # a part: 400 bytes; alone at most 640
    assert found.parts == [["l0", "l1", "l2"], ["l3", "l4"]]  # 3 x 100 held + 50 running = 350; a 4th passes 400
    assert set(found.too_big) == {"huge"}
    call = type("Call", (), {"input_bytes": 10, "output_bytes": 20})()
    assert held.layer_need(call, 8, 2.0) == held.Need(10, 20 + 16.0, "compiler")  # temporaries scaled to the batch
    assert held.layer_need(call, 8, None).total == 3 * (10 + 20)  # no compiler figure: three times its tensors
    assert "0.0 GiB (from its tensors' sizes)" in held.shortfall_reason("l", 8, held.layer_need(call, 8, None), 2**30)


def _chain(depth: int):
    from keras_models import keras, layers

    x = inputs = keras.Input((256,), name="x")
    for i in range(depth):
        x = layers.Dense(256, activation="relu", name=f"d{i}")(x)
    return keras.Model(inputs, x, name="chain")


def test_a_batch_whose_eager_capture_would_not_fit_is_measured_in_parts_and_one_too_big_gets_its_analysis(
        tmp_path, monkeypatch):
    """8 Dense layers, 1 KiB of activations a sample each, 640 KiB of headroom. At batch 64 one eager capture
    would hold 576 KiB (all of it, more than 80% of the headroom, so it was refused); each layer holds
    128 KiB: every cell is timed, in parts. At batch 1024 no cell fits: each is out of memory with the
    compiler's analysis at that batch."""
    import tbs
    from tbs.measure import headroom

    monkeypatch.setattr(headroom, "memory_headroom_bytes", lambda: 640 * KIB)
    p = tbs.profile(_chain(8), [4, 64, 1024], devices="cpu", timing=tbs.TimingConfig(**FAST), progress=None,
                    report=False, out=tmp_path / "p")
    s, m = p.summary.set_index(["layer", "batch_size"]), p.model.set_index("batch_size")
    old_estimate = 64 * (sum(layer["output_bytes"] / layer["batch_size"] for layer in p.metadata["layers"]) + 256 * 4)
    assert old_estimate > 0.8 * 640 * KIB  # the eager capture's rule refused this batch (every cell oom before)
    at64 = p.summary[p.summary["batch_size"] == 64]
    assert len(at64) == 8 and set(at64["status"]) <= {"ok", "noisy"} and m.loc[64, "status"] in ("ok", "noisy")
    assert p.metadata["sampled_in_chunks"]["cpu:0@64"] >= 2  # the layers' inputs were held a part at a time
    assert s.loc[("d3", 64), "flops"] == pytest.approx(16 * s.loc[("d3", 4), "flops"], rel=0.05)
    at1024 = p.summary[p.summary["batch_size"] == 1024]
    assert set(at1024["status"]) == {"oom"} and m.loc[1024, "status"] == "oom"
    assert at1024["reason"].str.contains("holds about").all() and "whole model" in m.loc[1024, "reason"]
    assert s.loc[("d3", 1024), "flops"] == pytest.approx(16 * s.loc[("d3", 64), "flops"], rel=0.05)  # analysed
    assert m.loc[1024, "flops"] == pytest.approx(16 * m.loc[64, "flops"], rel=0.05)
    assert "1024" in p.metadata["graph"]  # the layer graph at a batch that was never captured eagerly


LIMITED = """import atexit, pathlib, resource, runpy, sys
import tensorflow as tf
tf.constant(1.0) + 1
def status(key):
    return 1024 * int(next(l.split()[1] for l in pathlib.Path('/proc/self/status').read_text().splitlines()
                           if l.startswith(key)))
limit = status('VmData:') + int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
start = status('VmRSS:')
atexit.register(lambda: print('RSS_GROWTH', status('VmHWM:') - start, file=sys.stderr))
sys.argv = ['tbs', *sys.argv[1:]]
runpy.run_module('tbs', run_name='__main__')
"""


def test_under_a_real_memory_limit_a_batch_the_old_estimate_refused_runs_and_peaks_below_that_estimate(tmp_path):
    """A real process with 1 GiB of data-size limit above TensorFlow's own: 24 ReLU/Rescaling layers of 32 MiB
    each at batch 1024 (0.8 GiB of activations for one eager capture, which the limit cannot hold with the
    rest). Every cell is measured, and the process's peak grows by less than that estimate."""
    from conftest import ROOT
    from keras_models import keras, layers

    x = inputs = keras.Input((8192,), name="x")
    for i in range(24):
        x = layers.Activation("relu", name=f"r{i}")(x) if i % 2 == 0 else layers.Rescaling(0.5, name=f"s{i}")(x)
    with open(tmp_path / "deep.pkl", "wb") as f:
        pickle.dump(keras.Model(inputs, x, name="deep"), f)
    done = subprocess.run([sys.executable, "-c", LIMITED, str(2**30), "profile", str(tmp_path / "deep.pkl"),
                           "--batch", "256,1024", "--devices", "cpu:0", "--out", str(tmp_path / "p"), "--min-samples",
                           "3", "--max-cell-seconds", "0.05", "--min-span-seconds", "0", "--no-analysis"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    cells = pd.concat([pd.read_csv(tmp_path / "p" / f) for f in ("summary.csv", "model.csv")])
    assert set(cells.loc[cells["batch_size"] == 1024, "status"]) <= {"ok", "noisy"}
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["sampled_in_chunks"]["cpu:0@1024"] >= 2
    estimate = 1024 * (sum(layer["output_bytes"] for layer in meta["layers"]) + 8192 * 4 * 256) / 256
    growth = int(next(line.split()[1] for line in done.stderr.splitlines() if line.startswith("RSS_GROWTH")))
    assert growth < estimate, (growth, estimate)
