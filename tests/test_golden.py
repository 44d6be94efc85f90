"""Golden output: one fixed fake profile rendered to text, JSON and HTML, pinned byte for byte.

The profile is measured by the real Profiler on FakeDevices with a fake clock, so
every number is scripted. A change to a renderer shows up here as a diff to read;
when the change is meant, regenerate with ``TBS_UPDATE_GOLDEN=1 pytest tests/test_golden.py``.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from tbs.cost.reprice import reprice
from tbs.measure.timing import TimingConfig
from tbs.place.recommend import recommend
from tbs.report.base import render
from tbs.testing import FakeClock, FakeDevice, FakeModel, FakeLayer, fake_profile

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("TBS_UPDATE_GOLDEN") == "1"
TIMING = TimingConfig(min_samples=5, min_span_seconds=0.0)
# Scripted seconds per call, per layer and device (the GPU slower on the tiny first layer).
SECONDS = {
    "cpu:0": {"augment": 2e-4, "conv": lambda b: 4e-4 * b, "dense": lambda b: 1e-5 * b, "head": 5e-6},
    "gpu:0": {"augment": 6e-4, "conv": lambda b: 2e-3 + 2e-5 * b, "dense": 3e-5, "head": 4e-5},
}


def _model() -> FakeModel:
    layers = [FakeLayer("augment", layer_type="RandomFlip", category="preprocessing"),
              FakeLayer("conv", layer_type="Conv2D", category="conv", params=448),
              FakeLayer("dense", layer_type="Dense", category="dense", params=132),
              FakeLayer("head", layer_type="Dense", category="dense", params=10)]
    return FakeModel(layers, name="golden")


@pytest.fixture(scope="module")
def golden_profile(tmp_path_factory: pytest.TempPathFactory):
    clock = FakeClock()
    devices = [FakeDevice("cpu", 0, clock, SECONDS["cpu:0"]), FakeDevice("gpu", 0, clock, SECONDS["gpu:0"])]
    measured = fake_profile(tmp_path_factory.mktemp("golden") / "golden", _model(), devices, (8, 64), config=TIMING)
    # Copy costs are timed on the real clock: fix them, and everything that names a path or a machine.
    metadata = dict(measured.metadata, transfers={"cpu:0->gpu:0": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-10},
                                                  "gpu:0->cpu:0": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-10}},
                    host_device="cpu:0", host={"hostname": "golden-host"}, devices_missing={"tpu": "no TPU here"})
    metadata["layers"][0]["inactive"] = True  # RandomFlip hands its input back in inference
    profile = replace(measured, metadata=metadata, directory=Path("profiles/golden"),
                      transfers=measured.transfers.iloc[0:0])  # the copies' raw samples, timed on the real clock
    return reprice(profile, {"cpu": 0.5, "gpu": 3.0})


def _normalised(text: str) -> str:
    """Without what changes between runs of the same renderer: plotly.js itself and plotly's div ids."""
    text = re.sub(r"<script type='text/javascript'>.*?</script>", "<script>plotly.js</script>", text, count=1,
                  flags=re.S)
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", text)


@pytest.mark.parametrize("fmt, suffix", [("text", "txt"), ("json", "json"), ("html", "html")])
def test_renderers_match_their_golden_files(golden_profile, fmt, suffix):
    rec = recommend(golden_profile, "cost")
    text = _normalised(render(golden_profile, fmt, recommendation=rec, dataset_size=1_000_000))
    path = GOLDEN / f"report.{suffix}"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path}: run TBS_UPDATE_GOLDEN=1 pytest {__file__}"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{fmt} output changed; if that is meant, TBS_UPDATE_GOLDEN=1 pytest {__file__}"


def test_golden_profile_is_what_the_script_says(golden_profile):
    """The pinned numbers are the scripted ones, so the golden files show the renderers, not noise."""
    s = golden_profile.summary.set_index(["layer", "device", "batch_size"])
    assert s.loc[("conv", "cpu:0", 64), "median_s"] == pytest.approx(4e-4 * 64, rel=1e-6)
    assert s.loc[("head", "gpu:0", 8), "median_s"] == pytest.approx(4e-5, rel=1e-6)
    assert s.loc[("dense", "gpu:0", 8), "cost_per_sample_usd"] == pytest.approx(3e-5 / 8 * 3.0 / 3600, rel=1e-6)


def test_training_text_matches_its_golden_file(tmp_path):
    """A training profile's console view: phases per layer, Σ layers + loss against the train step, the epoch."""
    from tbs.testing.training import fake_training_profile

    profile = replace(fake_training_profile(tmp_path / "train"), directory=Path("profiles/train"))
    text = render(profile, "text", recommendation=recommend(profile, "cost"), dataset_size=50_000)
    path = GOLDEN / "training.txt"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden file {path}: run TBS_UPDATE_GOLDEN=1 pytest {__file__}"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"training text changed; if that is meant, TBS_UPDATE_GOLDEN=1 pytest {__file__}"
