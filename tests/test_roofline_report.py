"""The report's roofline, FLOPs-and-bytes and predicted-device views, on a hand-built profile (no measuring)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from tbs.profiles.profile import Profile
from tbs.profiles.roofline import with_roofline
from tbs.report import console, html, predicted, roofline
from tbs.report.page import ReportData
from tbs.columns import MODEL_COLUMNS, PREDICTION_COLUMNS, SAMPLE_COLUMNS, SUMMARY_COLUMNS

# name -> (FLOPs after XLA, bytes after, FLOPs before, bytes before); flatten has no FLOPs (pure data movement).
LAYERS = {"conv": (2e9, 1e8, 3e9, 4e8), "pool": (1e6, 5e7, 2e6, 1e8), "flatten": (None, 1e6, None, 2e6)}
SECONDS = {"conv": 0.01, "pool": 0.002, "flatten": 1e-5}  # per call at batch 8, on cpu:0
DEVICES = {"cpu:0": 1.0, "gpu:0": 0.1}  # time factor
CALIBRATION = {"cpu:0": {"matmul_flops_per_s": {"float32": 4e11}, "memory_bytes_per_s": 4e10},
               "gpu:0": {"matmul_flops_per_s": {"float32": 2e13}, "memory_bytes_per_s": 1e12}}
COMMON = dict(mode="inference", status="ok", cost_source="xla (test)", n=10, iterations=1)


def _cell(device: str, batch: int, seconds: float, counts: tuple) -> dict[str, object]:
    flops, moved, flops_before, moved_before = (None if c is None else c * batch / 8 for c in counts)
    return dict(device=device, device_kind=device[:3], batch_size=batch, median_s=seconds, p25_s=seconds,
                p75_s=seconds, per_sample_s=seconds / batch, flops=flops, bytes_accessed=moved,
                flops_unoptimized=flops_before, bytes_unoptimized=moved_before, temp_bytes=0, **COMMON)


def _predicted(layer: str, batch: int, seconds: float | None, target: str = "layer") -> dict[str, object]:
    reason = None if seconds else "not predicted: no compiler FLOPs/bytes for this cell on the measured device"
    return dict(target=target, layer=layer, device="h100", device_kind="gpu", batch_size=batch, mode="inference",
                source="predicted", predicted_from="cpu:0", median_s=seconds,
                low_s=seconds and seconds / 4, high_s=seconds and seconds * 4,
                per_sample_s=seconds and seconds / batch, usd_per_hour=11.0, price_source="https://prices.example",
                cost_per_sample_usd=seconds and seconds / batch * 11.0 / 3600, reason=reason,
                method=None if reason else "roofline scaling from cpu:0 (test); 90% band x/÷4; float32 matmul as tf32")


def make_profile(predicted: bool = True) -> Profile:
    """Two calibrated devices, two batch sizes, three layers; predictions for h100 scaled from cpu:0."""
    summary, model, predictions = [], [], []
    for batch in (8, 32):
        for device, factor in DEVICES.items():
            for name, counts in LAYERS.items():
                summary.append(_cell(device, batch, SECONDS[name] * factor * batch / 8, counts)
                               | dict(layer=name, layer_type=name.title(), category=name))
            totals = [sum(c[i] for c in LAYERS.values() if c[i]) for i in range(4)]
            whole = (totals[0], totals[1] * 0.5, totals[2], totals[3] * 0.5)  # fusion halves the bytes
            model.append(_cell(device, batch, 0.01 * factor * batch / 8, whole))
        predictions += [_predicted(name, batch, 1e-4 if name != "flatten" else None) for name in LAYERS]
        predictions.append(_predicted("(model)", batch, 2e-4 * batch / 8, target="model"))
    metadata = {"model": {"name": "toy"}, "mode": "inference", "status": "complete", "batch_sizes": [8, 32],
                "layers": [{"name": n, "type": n.title(), "category": n} for n in LAYERS],
                "devices": [{"name": d, "kind": d[:3]} for d in DEVICES], "calibration": CALIBRATION,
                "prediction": {"achievable_fraction": {"flops": 0.7, "bandwidth": 0.85},
                               "achievable_source": "defaults", "devices": {"h100": {"name": "NVIDIA H100"}}}}
    frame = pd.DataFrame(predictions if predicted else [], columns=PREDICTION_COLUMNS)
    return Profile(directory=Path("profiles/toy"), metadata=metadata,
                   summary=with_roofline(pd.DataFrame(summary).reindex(columns=SUMMARY_COLUMNS), CALIBRATION),
                   model=with_roofline(pd.DataFrame(model).reindex(columns=MODEL_COLUMNS), CALIBRATION),
                   samples=pd.DataFrame(columns=SAMPLE_COLUMNS), predictions=frame)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return make_profile()


def _traces(fig, name: str) -> list:
    return [t for t in fig.data if t.name and t.name.startswith(name)]


def test_roofline_draws_each_device_under_its_own_ceilings(profile: Profile) -> None:
    data = ReportData(profile)
    text = roofline.section_roofline(data)
    assert text.count('class="plotly-graph-div"') == len(DEVICES)  # one chart per measured device
    for device, calibration in CALIBRATION.items():
        s = data.summary[data.summary["device"] == device]
        fig = roofline.roofline_figure(s, data.model[data.model["device"] == device], device, [8, 32], calibration)
        (memory,), (compute,) = _traces(fig, "memory ceiling"), _traces(fig, "compute ceiling")
        assert set(compute.y) == {calibration["matmul_flops_per_s"]["float32"]}
        assert memory.y[0] / memory.x[0] == pytest.approx(calibration["memory_bytes_per_s"])
        assert memory.x[-1] == compute.x[0]  # they meet at the ridge
        drawn = sorted(x for t in fig.data if t.mode and "markers" in t.mode and t.x[0] is not None for x in t.x)
        expected = s[s["flops"].notna()]["arithmetic_intensity"].tolist() + \
            data.model[data.model["device"] == device]["arithmetic_intensity"].tolist()
        assert drawn == pytest.approx(sorted(expected))  # every analysed cell, and only those (flatten: no FLOPs)
    assert "cache" in text and "fused away" in text  # what a fraction above 1 means
    bounds = roofline.bound_table(data.summary)
    assert set(bounds["bound"]) <= {"compute", "memory", "overhead", "not analysed"}
    assert bounds.groupby(["device", "batch"])["layers"].sum().eq(len(LAYERS)).all()


def test_fig2_table_shows_before_and_after_and_what_fusion_saved(profile: Profile) -> None:
    data = ReportData(profile)
    frame, line = roofline.fig2_table(data, "cpu:0", 8)
    rows = frame.set_index("")
    assert list(rows.index[:2]) == ["whole model (one program)", "Σ layers (each compiled alone)"]
    assert rows.loc["conv", "FLOPs before XLA"] == "3 GFLOP" and rows.loc["conv", "FLOPs after"] == "2 GFLOP"
    assert rows.loc["conv", "bytes before XLA"] == "381 MiB" and rows.loc["conv", "bytes after"] == "95.4 MiB"
    assert rows.loc["flatten", "FLOPs after"] == ""  # not counted: blank, never 0
    assert "saves 50% of the bytes" in line and "xla (test)" in line
    assert "cpu:0" in roofline.section_fig2(data)  # says which device's programs it shows


def test_predicted_section_only_with_predictions_hatched_and_labelled(profile: Profile) -> None:
    bare = ReportData(make_profile(predicted=False))
    assert predicted.section_predicted(bare) == ""
    assert "predicted" not in [s.anchor for s in html.sections(bare)]
    assert "predicted" in [s.anchor for s in html.sections(ReportData(profile))]
    data = ReportData(profile)
    text = predicted.section_predicted(data)
    assert "Predicted, not measured" in text and "defaults" in text and "70% of peak FLOP/s" in text
    fig = predicted.predicted_figure(data, profile.predictions[profile.predictions["median_s"].notna()])
    hatched = [t for t in fig.data if t.marker.pattern.shape == "/"]
    assert hatched and all("(predicted)" in t.name for t in hatched)
    assert all(t.error_y.array for t in hatched)
    assert not any(t.marker.pattern.shape for t in fig.data if "(measured)" in t.name)
    assert re.search(r'"shape":"(/|\\u002f)"', text)  # the hatching, as plotly writes it
    assert re.search(r"h100</td><td>32</td><td>cpu:0</td><td>25 µs</td><td>6.25 µs – 100 µs", text)
    page = html.render(profile)
    assert page.index('id="model"') < page.index('id="roofline"') < page.index('id="predicted"')


def test_not_predicted_rows_are_listed_with_their_reason(profile: Profile) -> None:
    text = predicted.section_predicted(ReportData(profile))
    item = re.search(r"<h3>Not predicted</h3>.*?<li>(.*?)</li>", text).group(1)
    assert item.startswith("flatten on h100 at batch 8, 32") and "no compiler FLOPs/bytes" in item
    assert "<td>flatten</td><td>1.25 µs</td><td>not predicted</td>" in text  # beside its measured time


def test_console_labels_predictions_apart(profile: Profile) -> None:
    text = console.render(profile)
    block = text[text.index("Predicted (not measured)"):]
    assert "h100 @ batch 8: 25 µs/sample [6.25 µs – 100 µs]" in block
    assert "2 cell(s) not predicted" in block
    assert "Predicted" not in console.render(replace(profile, predictions=profile.predictions.iloc[:0]))


def test_points_whose_labels_would_overprint_share_one_label() -> None:
    """cnn_flowers' rescaling and two poolings sit within a tenth of a decade of each other: three names on one
    spot were unreadable. Points about a label's width apart share one label; a point a decade away keeps its own."""
    rows = pd.DataFrame({"layer": ["rescaling", "max_pooling2d", "max_pooling2d_1", "dense"],
                         "arithmetic_intensity": [0.125, 0.14, 0.16, 50.0],
                         "achieved_flops_per_s": [5.5e9, 6.0e9, 5.2e9, 4e11]})
    labels = roofline._point_labels(rows, str)
    assert labels == ["rescaling, max_pooling2d, max_pooling2d_1", "", "", "dense"]


def test_an_embeddings_roofline_counts_the_rows_it_reads_not_its_table() -> None:
    """XLA counts a gather's whole table (7.7 MB for 64 ids into a 30,000 x 64 table): the lookup sat far above the
    memory line, 'memory-bound'. Its roofline divides by the 33 KB it moves; bytes_accessed stays XLA's count."""
    from tbs.schema import LayerRecord

    emb = LayerRecord(name="emb", type="Embedding", category="embedding", params=30000 * 64,
                      input_shapes=[[None, 16]], output_shapes=[[None, 16, 64]], input_bytes=256,
                      output_bytes=16384, batch_size=4)
    rows = pd.DataFrame({"layer": ["emb", "dense"], "category": ["embedding", "dense"], "device": "cpu:0",
                         "batch_size": 4, "flops": [192.0, 1e6], "bytes_accessed": [7_696_640.0, 1e5],
                         "median_s": [2e-5, 1e-5]})
    calibration = {"cpu:0": {"matmul_flops_per_s": {"float32": 4e11}, "memory_bytes_per_s": 4e10}}
    plain, counted = with_roofline(rows, calibration), with_roofline(rows, calibration, {"emb": emb})
    assert plain.loc[0, "bound"] == "memory" and plain.loc[0, "fraction_of_roofline"] > 9  # 192 us of "memory"
    assert counted.loc[0, "achieved_bytes_per_s"] == pytest.approx(33024 / 2e-5)
    assert counted.loc[0, "bound"] == "overhead" and counted.loc[0, "bytes_accessed"] == 7_696_640.0
    assert counted.loc[1].equals(plain.loc[1])  # other layers as the compiler counts them
