"""The training view of every renderer, inference against training, and merging/re-pricing training profiles.

On ``tbs.testing.fake_training_profile``: rows written through the real ProfileStore, no framework.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from html.parser import HTMLParser
from io import StringIO

import pandas as pd
import pytest

from tbs.cost.reprice import reprice
from tbs.errors import ProfileError, TbsError
from tbs.profiles.merge import merge_each_mode, merge_profiles, split_by_mode
from tbs.profiles.profile import load_profile
from tbs.report import console, html, training_view as training
from tbs.report.winners import mode_differences, phase_table
from tbs.report.base import render
from tbs.report.figures import PHASE_COLORS, phase_figure
from tbs.schema import LOSS_LAYER
from tbs.testing.training import TRAINING_SECONDS, fake_training_profile

EPOCH = 50_000


class _Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts (no lxml needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def tables(page: str) -> list[pd.DataFrame]:
    """The page's tables as text frames: '' where a cell is blank."""
    parser = _Tables()
    parser.feed(page)
    return [pd.DataFrame(rows[1:], columns=rows[0]) for rows in parser.tables]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return fake_training_profile(tmp_path_factory.mktemp("t") / "train")


@pytest.fixture(scope="module")
def inferred(tmp_path_factory):
    return fake_training_profile(tmp_path_factory.mktemp("i") / "infer", training=False)


@pytest.fixture(scope="module")
def page(trained):
    return render(trained, "html", dataset_size=EPOCH)


def _row(profile, layer, device, batch):
    return profile.summary.set_index(["layer", "device", "batch_size"]).loc[(layer, device, batch)]


def test_the_fake_writes_what_the_schema_says(trained):
    s = trained.summary
    assert set(s["mode"]) == {"training"}
    assert (s["median_s"] - s[["forward_s", "backward_s", "update_s"]].sum(axis=1)).abs().max() < 1e-15
    assert dict(zip(s["layer"], s["phases"])) == {
        "vectorize": "forward", "embedding": "forward+backward+update", "pool": "forward+backward",
        "dense": "forward+backward+update", "head": "forward+backward+update", LOSS_LAYER: "forward+backward"}
    loss = _row(trained, LOSS_LAYER, "cpu:0", 64)
    assert loss["category"] == "loss" and loss["update_s"] == 0.0 and loss["layer_type"] == "SparseCategoricalCrossentropy"
    model = trained.model.set_index(["device", "batch_size"])
    layers_sum = s[(s["device"] == "gpu:0") & (s["batch_size"] == 8)]["median_s"].sum()
    assert model.loc[("gpu:0", 8), "layers_sum_s"] == pytest.approx(layers_sum)  # the loss row included
    assert set(trained.samples["phase"]) == {"forward", "backward", "update"}
    assert trained.metadata["layers"][-1]["name"] == LOSS_LAYER
    assert load_profile(trained.directory).mode == "training"


def test_the_page_draws_each_phase_stacked_in_its_own_colour(trained, page):
    data = html.ReportData(trained, EPOCH)
    fig = phase_figure(phase_table(trained.summary), data.view, data.devices, 64)
    bars = {t.name: t for t in fig.data}
    assert list(bars) == ["forward", "backward", "update"] and fig.layout.barmode == "stack"
    assert [bars[p].marker.color for p in bars] == list(PHASE_COLORS.values())
    pairs = list(zip(*bars["backward"].x))
    at = pairs.index(("embedding", "cpu:0"))
    assert bars["backward"].y[at] == pytest.approx(2e-5)  # 2e-5 * b seconds per call, per sample
    assert bars["update"].y[at] == pytest.approx(4e-4 / 64)
    assert bars["update"].y[pairs.index(("pool", "gpu:0"))] == 0.0  # no update: a real 0
    assert "Forward, backward and update per layer" in page and '"name":"backward"' in page


def test_cost_per_epoch_is_n_times_the_cost_per_training_sample(trained, page):
    step = trained.model.set_index(["device", "batch_size"]).loc[("cpu:0", 64)]
    expected = f"${step['cost_per_sample_usd'] * EPOCH:.3g}"
    assert f"cost / epoch ({EPOCH:,} samples)" in page
    cost_section = page[page.index('id="train-cost"'):page.index('id="memory"')]
    assert expected in cost_section
    without = training.section_training_cost(html.ReportData(trained))
    assert "cost / epoch" not in without and "--dataset-size N" in without


def test_an_unpriced_device_stays_unpriced_in_every_training_table(tmp_path):
    profile = fake_training_profile(tmp_path / "p", prices={"gpu": 3.0})
    section = training.section_training_cost(html.ReportData(profile, EPOCH))
    rows = tables(section)[0]
    cpu = rows[rows["device"] == "cpu:0"]
    assert set(cpu["cost / training sample"]) == {"no price"} and set(cpu[f"cost / epoch ({EPOCH:,} samples)"]) == {"no price"}
    assert not cpu["time / epoch"].isin(["-", ""]).any()


def test_memory_is_blank_where_unknown_never_zero(trained):
    section = training.section_training_memory(html.ReportData(trained))
    rows = tables(section)[0].set_index("layer")
    assert rows.loc[LOSS_LAYER, "residual activations, batch 64"] == ""  # unknown on every device
    assert rows.loc["pool", "residual activations, batch 8"] == "128 B (unknown on gpu:0)"
    assert rows.loc["vectorize", "residual activations, batch 8"] == "0 B"  # forward only: really nothing kept
    assert rows.loc["embedding", "optimizer slots"] == "12.5 KiB"
    assert rows.loc["Σ (known)", "residual activations, batch 64"] == "4 KiB (1 layer(s) unknown)"


def test_the_step_check_adds_phases_and_loss_against_the_whole_step(trained, page):
    section = training.section_training_cost(html.ReportData(trained))
    check = tables(section)[1]
    row = check[(check["batch"] == "64") & (check["device"] == "cpu:0")].iloc[0]
    assert float(row["Σ / whole"]) == pytest.approx(1 / 0.9, abs=0.01) and row["rows summed"] == "6 of 6"
    assert row["Σ backward"] == "32 µs"  # (2e-5 + 2e-6 + 8e-6 + 2e-6) * 64 / 64, the loss apart
    assert row["loss"] == "578 ns"


def test_a_failed_phase_is_blank_in_every_view(tmp_path):
    seconds = {d: dict(s) for d, s in TRAINING_SECONDS.items()}
    seconds["gpu:0"]["dense"] = (2e-5, 3e-5, lambda b: math.nan if b == 64 else 2e-5)
    profile = fake_training_profile(tmp_path / "p", seconds=seconds)
    row = _row(profile, "dense", "gpu:0", 64)
    assert row["status"] == "error" and math.isnan(row["update_s"]) and math.isnan(row["median_s"])
    data = html.ReportData(profile)
    fig = phase_figure(phase_table(profile.summary), data.view, data.devices, 64)
    update = next(t for t in fig.data if t.name == "update")
    at = list(zip(*update.x)).index(("dense", "gpu:0"))
    assert update.y[at] is None and "not measured (failed)" in update.hovertext[at]
    assert "20 µs / 30 µs / -" not in console.render(profile)  # per sample, not per call
    assert "312 ns / 469 ns / -" in console.render(profile)
    cells = tables(html.section_cells(data))[0]
    failed = cells[(cells["layer"] == "dense") & (cells["device"] == "gpu:0") & (cells["batch_size"] == "64")].iloc[0]
    assert failed["update / sample"] == "" and failed["forward / sample"] == "312 ns"


def test_console_shows_phases_for_training_only(trained, inferred):
    text = render(trained, "text", dataset_size=EPOCH)
    assert "forward / backward / update per sample" in text and "whole train step" in text
    assert "Σ layers + loss" in text and f"one epoch of {EPOCH:,} samples" in text
    assert "forward / backward / update" not in render(inferred, "text")


def test_json_carries_the_mode_the_training_setup_and_the_step_check(trained):
    out = json.loads(render(trained, "json"))
    assert out["mode"] == "training" and out["training"]["optimizer"]["name"] == "Adam"
    assert {r["device"] for r in out["step_check"]} == {"cpu:0", "gpu:0"}
    assert {"forward_s", "backward_s", "update_s", "residual_bytes"} <= set(out["layers"][0])


def test_cheapest_device_changes_from_inference_to_training(trained, inferred):
    found = mode_differences(inferred.summary, trained.summary)
    changed = found[found["differs"]]
    assert list(zip(changed["layer"], changed["batch_size"])) == [("embedding", 64)]
    row = changed.iloc[0]
    assert (row["inference"], row["training"], row["by"]) == ("cpu:0", "gpu:0", "cost")
    assert LOSS_LAYER not in set(found["layer"])  # inference has no loss to compare


def test_without_every_price_the_modes_are_compared_by_time(tmp_path, inferred):
    unpriced = fake_training_profile(tmp_path / "p", prices={"gpu": 3.0})
    found = mode_differences(inferred.summary, unpriced.summary)
    assert set(found["by"]) == {"time"}


def test_either_order_renders_both_views_and_the_differences(trained, inferred):
    one = render(inferred, "html", other_mode=trained)
    assert render(inferred, "text", other_mode=trained) == render(trained, "text", other_mode=inferred)
    assert 'id="t-phases"' in one and 'id="i-summary"' in one and 'id="t-summary"' in one
    assert 'id="phases"' not in one and 'id="i-phases"' not in one  # inference has no phases section
    assert "In 1 of 10 layer × batch cells the cheapest device differs" in one
    text = render(inferred, "text", other_mode=trained)
    assert text.index("== training") < text.index("== inference") < text.index("== where the cheapest")
    both = json.loads(render(trained, "json", other_mode=inferred))
    assert [r["layer"] for r in both["mode_differences"] if r["differs"]] == ["embedding"]
    rows = pd.read_csv(StringIO(render(trained, "csv", other_mode=inferred)))
    assert set(rows["mode"]) == {"training", "inference"}
    with pytest.raises(TbsError, match="one inference and one training profile"):
        render(trained, "html", other_mode=trained)


def _on(profile, host, **training):
    metadata = dict(profile.metadata, host={"hostname": host})
    if training:
        metadata["training"] = dict(metadata["training"], **training)
    return replace(profile, metadata=metadata)


def test_training_profiles_merge_and_reprice_like_inference_ones(trained, inferred):
    merged = merge_profiles([_on(trained, "a"), _on(trained, "b")])
    assert {"a/cpu:0", "b/gpu:0"} <= set(merged.summary["device"]) and merged.mode == "training"
    assert merged.summary["backward_s"].notna().sum() == 2 * trained.summary["backward_s"].notna().sum()
    priced = reprice(merged, {"b/gpu:0": 6.0})
    row = priced.summary[(priced.summary["device"] == "b/gpu:0") & (priced.summary["layer"] == "dense")].iloc[0]
    assert row["cost_per_sample_usd"] == pytest.approx(row["per_sample_s"] * 6.0 / 3600)
    assert row["forward_s"] + row["backward_s"] + row["update_s"] == pytest.approx(row["median_s"])
    assert "b/gpu:0" in render(priced, "text", dataset_size=EPOCH)  # a merged training profile renders
    with pytest.raises(ProfileError, match="optimizer 'SGD'"):
        merge_profiles([_on(trained, "a"), _on(trained, "b", optimizer={"name": "SGD"})])


def test_profiles_are_split_by_mode_and_each_mode_merged(trained, inferred):
    groups = split_by_mode([_on(trained, "a"), _on(inferred, "a"), _on(trained, "b")])
    assert list(groups) == ["inference", "training"] and len(groups["training"]) == 2
    main, other = merge_each_mode([_on(inferred, "a"), _on(trained, "a"), _on(trained, "b")])
    assert main.mode == "training" and other.mode == "inference" and len(main.metadata["merged_from"]) == 2
    alone, none = merge_each_mode([inferred])
    assert alone is inferred and none is None
    with pytest.raises(ProfileError, match="with mode 'training'"):
        merge_profiles([inferred, trained])


def test_the_dataset_size_given_to_tbs_profile_prices_the_epoch(trained):
    recorded = replace(trained, metadata=dict(trained.metadata, samples=1000))
    assert "one epoch of 1,000 samples" in render(recorded, "text")
    assert "one epoch of 20 samples" in render(recorded, "text", dataset_size=20)  # --dataset-size at report time wins
    assert "one epoch" not in render(trained, "text")


def test_with_one_device_in_common_the_comparison_says_there_is_nothing_to_compare(trained, inferred):
    cpu_only = replace(inferred, summary=inferred.summary[inferred.summary["device"] == "cpu:0"])
    text = render(trained, "text", other_mode=cpu_only)
    assert "share 1 device (cpu:0): there is no cheapest device to compare" in text


def test_every_section_of_a_training_report_has_its_own_anchor(page):
    import re

    anchors = re.findall(r'<h2 id="([^"]+)"', page)
    assert len(anchors) == len(set(anchors)) and {"memory", "capacity", "roofline"} <= set(anchors)
    links = re.findall(r'<a href="#([^"]+)">', page.split("</nav>")[0])
    assert set(links) <= set(anchors) and len(links) == len(set(links))


def test_dataset_size_is_named_for_what_it_is_and_samples_still_works(tmp_path):
    from click.testing import CliRunner

    from tbs.cli import cli

    fake_training_profile(tmp_path / "t")
    new = CliRunner().invoke(cli, ["report", str(tmp_path / "t"), "--dataset-size", "50000"])
    old = CliRunner().invoke(cli, ["report", str(tmp_path / "t"), "--samples", "50000"])
    assert new.exit_code == old.exit_code == 0, new.output + old.output
    assert "one epoch of 50,000 samples" in new.stdout and new.stdout == old.stdout
    assert new.stderr == "" and "--samples is the old name of --dataset-size" in old.stderr
    both = CliRunner().invoke(cli, ["report", str(tmp_path / "t"), "--samples", "5", "--dataset-size", "5"])
    assert both.exit_code == 2 and len(both.output.strip().splitlines()) == 1 and "old name" in both.output


def test_the_other_mode_is_passed_by_its_name_or_its_old_one(trained, inferred):
    import tbs

    assert tbs.render(inferred, "text", other_mode=trained) == tbs.render(inferred, "text", compare=trained)
    with pytest.raises(TbsError, match="compare= is the old name of other_mode="):
        tbs.render(inferred, "text", other_mode=trained, compare=trained)
