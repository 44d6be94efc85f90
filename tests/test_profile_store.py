import json

import pandas as pd

from tbs.profiles.profile import load_profile, with_layer_sums
from tbs.profiles.store import ProfileStore
from tbs.schema import MODEL_LAYER, CellKey

cell_key = CellKey.of


def _row(layer, device="cpu:0", batch=8, median=1e-3):
    return {"layer": layer, "layer_type": "Dense", "category": "dense", "device": device, "device_kind": "cpu",
            "batch_size": batch, "mode": "inference", "status": "ok", "n": 3, "median_s": median,
            "per_sample_s": median / batch}


def _samples(target, layer, n=3):
    return [{"target": target, "layer": layer, "device": "cpu:0", "batch_size": 8, "mode": "inference",
             "sample": i, "iterations": 10, "raw_seconds": 0.01, "seconds_per_call": 1e-3} for i in range(n)]


def test_cells_are_written_as_they_finish_and_resume_skips_them(tmp_path):
    store = ProfileStore(tmp_path / "p")
    meta = {"model": {"sha256": "abc"}, "layers": [{"name": "a"}, {"name": "b"}]}
    store.create(meta)
    key_a = cell_key("layer", "a", "cpu:0", 8, "inference")
    store.add_cell(key_a, _row("a"), _samples("layer", "a"))
    # a cell whose samples landed but whose summary row did not (killed in between)
    store._append("samples", _samples("layer", "b"), list(pd.read_csv(store.paths["samples"]).columns))
    assert json.loads(store.paths["metadata"].read_text())["status"] == "running"
    store.update_metadata(status="interrupted")

    resumed = ProfileStore(tmp_path / "p")
    assert resumed.resume(meta) == 1
    assert resumed.is_done(key_a)
    assert not resumed.is_done(cell_key("layer", "b", "cpu:0", 8, "inference"))
    samples = load_profile(tmp_path / "p").samples
    assert set(samples["layer"]) == {"a"}  # b's orphan samples were dropped, b will be re-measured


def test_resume_refuses_another_model(tmp_path):
    store = ProfileStore(tmp_path / "p")
    store.create({"model": {"sha256": "abc"}})
    import pytest
    from tbs.errors import ProfileError

    with pytest.raises(ProfileError, match="different model"):
        ProfileStore(tmp_path / "p").resume({"model": {"sha256": "def"}})


def test_layer_sums_join_the_model_rows():
    summary = pd.DataFrame([_row("a", median=1e-3), _row("b", median=2e-3), _row("a", batch=16, median=5e-3)])
    model = pd.DataFrame([{"device": "cpu:0", "batch_size": 8, "mode": "inference", "median_s": 2.9e-3},
                          {"device": "cpu:0", "batch_size": 16, "mode": "inference", "median_s": 5e-3}])
    out = with_layer_sums(summary, model)
    assert list(out["layers_sum_s"]) == [3e-3, 5e-3]
    assert list(out["layers_measured"]) == [2, 1]
    assert out["layers_sum_per_sample_s"].iloc[0] == 3e-3 / 8
    assert MODEL_LAYER == "(model)"
