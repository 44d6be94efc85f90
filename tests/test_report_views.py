"""The report's linear views and inactive-layer marks, on hand-built profiles (no measuring)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from tbs.profiles.profile import Profile
from tbs.report import console, figures, html
from tbs.report.page import ReportData
from tbs.columns import MODEL_COLUMNS, SAMPLE_COLUMNS, SUMMARY_COLUMNS

LAYERS = [("rescale", "Rescaling", "preprocessing", False), ("random_flip", "RandomFlip", "augmentation", True),
          ("conv", "Conv2D", "conv", False), ("dropout", "Dropout", "regularization", True),
          ("dense", "Dense", "dense", False)]
# Seconds per sample at batch 1; batch 8 is cheaper per sample by the device's factor.
BASE = {"rescale": 2e-6, "random_flip": 5e-8, "conv": 4e-4, "dropout": 4e-8, "dense": 6e-5}
SPEED = {"cpu:0": 1.0, "gpu:0": 0.25, "tpu:0": 0.5}
KIND = {"cpu:0": "cpu", "gpu:0": "gpu", "tpu:0": "tpu"}
PRICES = {"gpu:0": 3.0, "tpu:0": 4.5}  # cpu:0 has no price
FAILED = {("conv", "gpu:0", 8): "oom"}  # one layer missing on one device at one batch


def _row(per_sample: float, batch: int, price: float | None) -> dict[str, object]:
    median = per_sample * batch
    return {"n": 10, "iterations": 5, "median_s": median, "p25_s": 0.9 * median, "p75_s": 1.1 * median,
            "ci_low_s": 0.97 * median, "ci_high_s": 1.03 * median, "per_sample_s": per_sample,
            "usd_per_hour": price, "cost_per_sample_usd": None if price is None else per_sample * price / 3600,
            "first_call_s": 0.01, "host": "box", "reason": None}


def _failed(status: str, price: float | None) -> dict[str, object]:
    return {"n": 0, "iterations": 0, "median_s": None, "p25_s": None, "p75_s": None, "ci_low_s": None,
            "ci_high_s": None, "per_sample_s": None, "usd_per_hour": price, "cost_per_sample_usd": None,
            "first_call_s": None, "host": "box", "reason": "out of memory"} | {"status": status}


def make_profile(mode: str = "inference", inactive_key: bool = True, prices: dict[str, float] | None = None,
                 batches: tuple[int, ...] = (1, 8)) -> Profile:
    """A three-device, two-batch profile with one failed cell, built by hand."""
    prices = PRICES if prices is None else prices
    summary, model = [], []
    for batch in batches:
        for device, speed in SPEED.items():
            price, total = prices.get(device), 0.0
            for name, kind, category, _ in LAYERS:
                key = dict(layer=name, layer_type=kind, category=category, device=device,
                           device_kind=KIND[device], batch_size=batch, mode=mode)
                status = FAILED.get((name, device, batch))
                per_sample = BASE[name] * speed * (0.5 if batch > 1 else 1.0)
                summary.append(key | (_failed(status, price) if status else _row(per_sample, batch, price)
                                      | {"status": "ok"}))
                total += 0.0 if status else per_sample
            whole = _row(0.8 * total, batch, price) | {"status": "ok", "dispatch_overhead_s": 1e-5,
                                                        "input_copy_s": 2e-6, "input_bytes": 4096}
            model.append(whole | dict(device=device, device_kind=KIND[device], batch_size=batch, mode=mode))
    layers = [{"name": n, "type": t, "category": c, **({"inactive": i} if inactive_key else {})}
              for n, t, c, i in LAYERS]
    metadata = {"model": {"name": "toy", "class": "Sequential", "params": 123, "path": "models/toy.keras"},
                "mode": mode, "layers": layers, "batch_sizes": list(batches), "status": "complete",
                "devices": [{"name": d, "kind": KIND[d], "description": f"a {KIND[d]}"} for d in SPEED],
                "prices_usd_per_hour": prices}
    return Profile(directory=Path("profiles/toy"), metadata=metadata,
                   summary=pd.DataFrame(summary, columns=SUMMARY_COLUMNS),
                   model=pd.DataFrame(model, columns=MODEL_COLUMNS), samples=pd.DataFrame(columns=SAMPLE_COLUMNS))


@pytest.fixture
def profile() -> Profile:
    return make_profile()


def _view(profile: Profile) -> figures.View:
    return html.ReportData(profile).view


def _stack(profile: Profile, batch: int, objective: str = "time", devices: list[str] | None = None):
    data = html.ReportData(profile)
    devices = devices or (data.devices if objective == "time" else data.priced_devices)
    return figures.layer_stack(data.summary, data.view, devices, batch, objective), data


def _stacked(profile: Profile, batch: int, objective: str = "time"):
    stack, data = _stack(profile, batch, objective)
    return figures.stacked_figure(stack, figures.whole_model(data.model, batch, objective),
                                  figures.missing_cells(data.summary, stack, batch), data.view, batch, objective)


def _bar_totals(fig) -> dict[str, float]:
    """Read the figure back: per bar (device row), the sum of its stacked segments."""
    totals: dict[str, float] = {}
    for trace in fig.data:
        if trace.type != "bar":
            continue
        for label, x in zip(trace.y, trace.x):
            device = re.match(r"<b>([^<]+)</b>", label).group(1)
            totals[device] = totals.get(device, 0.0) + (x or 0.0)
    return totals


@pytest.mark.parametrize("batch", [1, 8])
def test_stacked_bar_total_is_the_sum_of_layer_medians(profile, batch):
    s = profile.summary
    measured = s[(s["batch_size"] == batch) & s["status"].isin(["ok", "noisy", "cpu-fallback"])]
    expected = measured.groupby("device")["per_sample_s"].sum()
    totals = _bar_totals(_stacked(profile, batch))
    assert set(totals) == set(expected.index)
    for device, total in totals.items():
        assert total == pytest.approx(expected[device], rel=1e-12)


def test_stacked_bar_segments_follow_layer_order_and_whole_model_is_a_diamond(profile):
    fig = _stacked(profile, 1)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["rescale", "random_flip\u00a0†", "conv", "dropout\u00a0†", "dense"]
    diamond = [t for t in fig.data if t.type == "scatter"][0]
    assert diamond.marker.symbol == "diamond"
    whole = profile.model[profile.model["batch_size"] == 1].set_index("device")["per_sample_s"]
    for label, x in zip(diamond.y, diamond.x):
        assert x == pytest.approx(whole[re.match(r"<b>([^<]+)</b>", label).group(1)])


def test_a_device_missing_layers_says_so_instead_of_a_silently_short_bar(profile):
    fig = _stacked(profile, 8)
    gpu = [label for label in fig.data[0].y if label.startswith("<b>gpu:0</b>")][0]
    assert "only 4 of 5 layers measured" in gpu
    assert "gpu:0: 1 layer(s) not measured" in fig.layout.title.text and "conv (oom)" in fig.layout.title.text
    assert all("of 5 layers" not in label for label in fig.data[0].y if not label.startswith("<b>gpu:0"))


def test_cost_bars_leave_out_unpriced_devices(profile):
    fig = _stacked(profile, 1, "cost")
    devices = {re.match(r"<b>([^<]+)</b>", label).group(1) for t in fig.data for label in t.y}
    assert devices == {"gpu:0", "tpu:0"}
    s = profile.summary
    gpu = s[(s["device"] == "gpu:0") & (s["batch_size"] == 1)]["cost_per_sample_usd"].sum()
    assert _bar_totals(fig)["gpu:0"] == pytest.approx(gpu * 1_000_000)  # drawn per 1M samples
    page = html.render(profile)
    assert "Left out of the cost bars (no price, not $0): cpu:0" in page


def test_heatmap_best_is_one_and_missing_is_blank_not_zero(profile):
    stack, data = _stack(profile, 8)
    ratio = figures.relative_to_best(stack)
    assert (ratio.min(axis=1) == 1.0).all()
    assert math.isnan(ratio.loc["conv", "gpu:0"])
    assert ratio.loc["conv", "cpu:0"] == pytest.approx(2.0)  # tpu is the best for conv at batch 8
    heat = figures.heatmap_figure({"time": stack}, data.view, 8).data[0]
    assert heat.z[list(heat.y).index("conv")][list(heat.x).index("gpu:0")] is None  # null in the page's JSON
    assert [min(v for v in row if v is not None) for row in heat.z] == [1.0] * 5
    scale = figures.heatmap_figure({"time": stack}, data.view, 8).layout.coloraxis
    assert scale.cmin == 1.0 and scale.colorscale[0][0] == 0.0  # 1.0 gets the scale's own first colour
    grids = [json.loads(z) for z in re.findall(r'"z":(\[\[.*?\]\])', html.render(profile))]
    rows = [row for grid in grids for row in grid]  # every heatmap in the page: time and cost, both batches
    assert len(grids) == 4 and sum(row.count(None) for row in rows) == 2  # conv on gpu:0 at batch 8, twice
    assert all(min(v for v in row if v is not None) == 1.0 for row in rows) and 0 not in sum(rows, [])


def test_heatmap_hover_gives_the_absolute_value(profile):
    stack, data = _stack(profile, 1)
    heat = figures.heatmap_figure({"time": stack}, data.view, 1).data[0]
    hover = pd.DataFrame(heat.hovertext, index=list(heat.y), columns=list(heat.x))
    assert "400 µs per sample" in hover.loc["conv", "cpu:0"] and "4.00× the best (gpu:0)" in hover.loc["conv", "cpu:0"]
    assert "inactive in inference" in hover.loc["dropout\u00a0†", "cpu:0"]


def test_new_sections_come_right_after_the_summary_with_nav_links(profile):
    names = [s.render.__name__ for s in html.sections(ReportData(profile))]
    assert names[:5] == ["section_summary", "section_where", "section_layer_table", "section_relative",
                         "section_per_batch"]
    page = html.render(profile)
    for anchor in ("where", "every-layer", "relative", "layers"):
        assert f'href="#{anchor}"' in page and f'id="{anchor}"' in page
    places = [page.index(f'id="{anchor}"') for anchor in ("summary", "where", "every-layer", "relative", "layers")]
    assert places == sorted(places)
    assert "Spread per layer (log scale)" in page


def test_inactive_layers_are_marked_in_console(profile):
    table = console.batch_table(profile, 1)
    assert "random_flip †" in table and "dropout †" in table
    assert "rescale †" not in table
    text = console.render(profile)  # every batch's table, then what † means, once
    footnotes = [line for line in text.splitlines() if line.startswith("†")]
    assert len(footnotes) == 1 and "inactive in inference" in footnotes[0] and text.endswith(footnotes[0])
    assert "tbs profile models/toy.keras --training" in footnotes[0]


def test_inactive_layers_are_marked_in_html(profile):
    page = html.render(profile)
    assert "random_flip\u00a0†" in page and "dropout\u00a0†" in page
    assert "inactive in inference: passes its input through" in page  # hover text and the Every cell table
    cells = page[page.index('id="cells"'):page.index('id="missing"')]
    assert "<td>dropout\u00a0†</td>" in cells and "† inactive in inference" in cells
    assert page.count('class="note inactive"') == 1
    assert "tbs profile models/toy.keras --training" in page


def test_training_mode_says_inactive_in_training_without_the_hint():
    profile = make_profile(mode="training")
    text = console.render(profile)
    assert "inactive in training" in text and "--training" not in text
    assert "inactive in training" in html.render(profile)


def test_profile_without_the_inactive_key_renders_as_before():
    profile = make_profile(inactive_key=False)
    table = console.batch_table(profile, 1)
    assert "†" not in table and "inactive" not in table
    page = html.render(profile)
    assert "†" not in page and "inactive in" not in page
    shown = html.sections(ReportData(profile))
    assert all(f'id="{s.anchor}"' in page for s in shown if s.anchor != "placement") and "Plotly" in page


def test_no_prices_draws_time_only_and_says_why():
    profile = make_profile(prices={})
    page = html.render(profile)
    where = page[page.index('id="where"'):page.index('id="relative"')]
    assert "No device has a price, so no cost bars" in where
    assert where.count("cost per 1M samples") == 0


def test_cost_heatmap_compares_priced_devices_only(profile):
    page = html.render(profile)
    stack, data = _stack(profile, 1, "cost")
    fig = figures.heatmap_figure({"time": _stack(profile, 1)[0], "cost": stack}, data.view, 1)
    assert [list(t.x) for t in fig.data] == [["cpu:0", "gpu:0", "tpu:0"], ["gpu:0", "tpu:0"]]
    assert "cost per sample (priced devices)" in page


def test_one_device_has_nothing_to_compare_but_still_stacks():
    profile = make_profile()
    profile.summary = profile.summary[profile.summary["device"] == "gpu:0"]
    profile.model = profile.model[profile.model["device"] == "gpu:0"]
    page = html.render(profile)
    assert "One device profiled: nothing to compare" in page
    assert _bar_totals(_stacked(profile, 1)) == {"gpu:0": pytest.approx(sum(BASE.values()) * SPEED["gpu:0"])}


def test_a_zero_time_is_marked_on_the_log_axis_and_has_no_ratio(profile):
    zero = profile.summary["layer"].eq("random_flip") & profile.summary["device"].eq("gpu:0")
    profile.summary.loc[zero, ["median_s", "per_sample_s", "p25_s", "p75_s", "cost_per_sample_usd"]] = 0.0
    data = html.ReportData(profile)
    fig = figures.spread_figure(data.summary, data.view, data.devices, 1, "time")
    marks = [t for t in fig.data if t.type == "scatter"]
    assert len(marks) == 1 and list(marks[0].x) == ["random_flip\u00a0†"] and marks[0].y[0] > 0
    ratio = figures.relative_to_best(_stack(profile, 1)[0])
    assert ratio.loc["random_flip", "gpu:0"] == 1.0 and math.isnan(ratio.loc["random_flip", "cpu:0"])


def test_an_empty_profile_still_renders(profile):
    profile.summary = profile.summary.iloc[0:0]
    profile.model = profile.model.iloc[0:0]
    assert "Where the time and the money go" in html.render(profile)
    assert console.render(profile) == ""
