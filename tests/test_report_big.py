"""Big models in the report and the console: the heaviest layers and a fold, totals per kind and per block,
blocks from Keras nesting or name prefixes, and the sortable per-layer table (hand-built profiles, no measuring)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from tbs.cli import cli
from tbs.profiles.profile import Profile
from tbs.report import console, html
from tbs.report.groups import DEFAULT_TOP, blocks, fold, layer_groups, name_block
from tbs.report.page import ReportData
from tbs.columns import MODEL_COLUMNS, SAMPLE_COLUMNS, SUMMARY_COLUMNS

# Real layer names (and classes) of keras.applications models, a slice of each.
RESNET50 = [("conv1_pad", "ZeroPadding2D"), ("conv1_conv", "Conv2D"), ("conv1_bn", "BatchNormalization"),
            ("conv1_relu", "Activation"), ("pool1_pad", "ZeroPadding2D"), ("pool1_pool", "MaxPooling2D"),
            ("conv2_block1_1_conv", "Conv2D"), ("conv2_block1_1_bn", "BatchNormalization"),
            ("conv2_block1_0_conv", "Conv2D"), ("conv2_block1_add", "Add"), ("conv2_block1_out", "Activation"),
            ("conv2_block2_1_conv", "Conv2D"), ("conv2_block2_out", "Activation"),
            ("avg_pool", "GlobalAveragePooling2D"), ("predictions", "Dense")]
EFFICIENTNET = [("rescaling", "Rescaling"), ("normalization", "Normalization"), ("stem_conv_pad", "ZeroPadding2D"),
                ("stem_conv", "Conv2D"), ("stem_bn", "BatchNormalization"), ("stem_activation", "Activation"),
                ("block1a_dwconv", "DepthwiseConv2D"), ("block1a_se_squeeze", "GlobalAveragePooling2D"),
                ("block1a_project_bn", "BatchNormalization"), ("block2a_expand_conv", "Conv2D"),
                ("block2a_dwconv_pad", "ZeroPadding2D"), ("top_conv", "Conv2D"), ("top_bn", "BatchNormalization"),
                ("avg_pool", "GlobalAveragePooling2D"), ("top_dropout", "Dropout"), ("predictions", "Dense")]
INCEPTION = [("inception_v3/conv2d", "Conv2D"), ("inception_v3/batch_normalization", "BatchNormalization"),
             ("inception_v3/activation", "Activation"), ("inception_v3/mixed0", "Concatenate"),
             ("inception_v3/conv2d_1", "Conv2D"), ("inception_v3/mixed9_0", "Concatenate"),
             ("inception_v3/concatenate", "Concatenate"), ("inception_v3/mixed9", "Concatenate"),
             ("global_average_pooling2d", "GlobalAveragePooling2D"), ("dense", "Dense"), ("dense_1", "Dense")]
BERT = [("token_embedding", "Embedding"), ("position_embedding", "Embedding"), ("embedding_add", "Add"),
        ("embedding_norm", "LayerNormalization"), ("transformer_layer_0/attention", "MultiHeadAttention"),
        ("transformer_layer_0/attention_norm", "LayerNormalization"), ("transformer_layer_0/gelu", "Activation"),
        ("transformer_layer_1/attention", "MultiHeadAttention"), ("transformer_layer_1/output", "Dense"),
        ("pool", "GlobalAveragePooling1D"), ("pooler", "Dense"), ("classifier", "Dense")]


def _blocks(named: list[tuple[str, str]]) -> list[str]:
    return blocks([n for n, _ in named], [t for _, t in named])


def test_flat_names_give_their_block_by_prefix():
    assert [name_block(n) for n in ("conv2_block1_1_conv", "conv2_block1_out", "block2a_expand_conv", "conv1_bn",
                                    "avg_pool", "predictions")] == [
        "conv2_block1", "conv2_block1", "block2a", "conv1", None, None]
    assert _blocks(RESNET50) == ["conv1"] * 4 + ["pool1"] * 2 + ["conv2_block1"] * 5 + ["conv2_block2"] * 2 + [
        "avg_pool", "predictions"]
    assert _blocks(EFFICIENTNET) == ["stem"] * 6 + ["block1a"] * 3 + ["block2a"] * 2 + ["top"] * 2 + [
        "avg_pool", "top", "predictions"]


def test_nesting_gives_the_block_and_an_outer_model_is_looked_into():
    assert _blocks(BERT) == ["token_embedding", "position_embedding", "embedding", "embedding"] + [
        "transformer_layer_0"] * 3 + ["transformer_layer_1"] * 2 + ["pool", "pooler", "classifier"]
    # InceptionV3 nested whole in ic_dr: Keras's automatic names join the next named layer (mixedN ends a block)
    assert _blocks(INCEPTION) == ["inception_v3/mixed0"] * 4 + ["inception_v3/mixed9"] * 4 + [
        "global_average_pooling2d", "dense", "dense_1"]


def test_a_small_flat_model_has_a_block_per_layer():
    named = [("rescaling", "Rescaling"), ("conv2d", "Conv2D"), ("conv2d_1", "Conv2D"), ("dense", "Dense")]
    assert _blocks(named) == ["rescaling", "conv2d", "conv2d_1", "dense"]


# A ResNet-like profile of 32 layers on two devices: one heavy conv per block, light layers around it.
NAMES = [(f"conv{s}_block{b}_{part}", t, c) for s in (2, 3) for b in (1, 2, 3, 4)
         for part, t, c in (("1_conv", "Conv2D", "conv"), ("1_bn", "BatchNormalization", "normalization"),
                            ("1_relu", "Activation", "other"), ("out", "ReLU", "other"))]
SPEED = {"cpu:0": 1.0, "cpu:1": 2.0}


def big_profile() -> Profile:
    summary, model = [], []
    for batch in (1, 8):
        for device, speed in SPEED.items():
            total = 0.0
            for i, (name, kind, category) in enumerate(NAMES):
                per_sample = (1e-3 * (1 + i) if kind == "Conv2D" else 1e-5) * speed
                median = per_sample * batch
                summary.append(dict(layer=name, layer_type=kind, category=category, device=device, device_kind="cpu",
                                    batch_size=batch, mode="inference", status="ok", n=10, iterations=5,
                                    median_s=median, p25_s=0.9 * median, p75_s=1.1 * median, ci_low_s=0.97 * median,
                                    ci_high_s=1.03 * median, per_sample_s=per_sample, usd_per_hour=0.5,
                                    cost_per_sample_usd=per_sample * 0.5 / 3600, host="box"))
                total += per_sample
            model.append(dict(device=device, device_kind="cpu", batch_size=batch, mode="inference", status="ok",
                              median_s=0.8 * total * batch, per_sample_s=0.8 * total, usd_per_hour=0.5,
                              cost_per_sample_usd=0.8 * total * 0.5 / 3600, n=10))
    metadata = {"model": {"name": "resnetish", "class": "Functional", "params": 1}, "mode": "inference",
                "layers": [{"name": n, "type": t, "category": c} for n, t, c in NAMES], "batch_sizes": [1, 8],
                "status": "complete", "devices": [{"name": d, "kind": "cpu", "description": "a cpu"} for d in SPEED],
                "prices_usd_per_hour": {"cpu": 0.5}}
    return Profile(directory=Path("profiles/resnetish"), metadata=metadata,
                   summary=pd.DataFrame(summary, columns=SUMMARY_COLUMNS),
                   model=pd.DataFrame(model, columns=MODEL_COLUMNS), samples=pd.DataFrame(columns=SAMPLE_COLUMNS))


@pytest.fixture
def profile() -> Profile:
    return big_profile()


def _table_lines(text: str, batch: int) -> list[str]:
    return text.split(f"batch {batch}:")[1].split("\n\n")[0].splitlines()


def test_console_shows_the_heaviest_layers_and_folds_the_rest(profile):
    lines = _table_lines(console.render(profile, top=5), 8)
    convs = [f"conv3_block{b}_1_conv" for b in (4, 3, 2, 1)] + ["conv2_block4_1_conv"]
    assert [line.split()[0] for line in lines[2:7]] == convs  # heaviest first
    fold_line = lines[7]
    folded = [n for n, _, _ in NAMES if n not in convs]
    seconds = sum(1e-3 * (1 + i) if t == "Conv2D" else 1e-5 for i, (n, t, _) in enumerate(NAMES) if n in folded)
    total = sum(1e-3 * (1 + i) if t == "Conv2D" else 1e-5 for i, (n, t, _) in enumerate(NAMES))
    assert fold_line.split()[:4] == ["…", "27", "more", "layers"]
    assert f"({seconds / total:.1%} of the time)" in fold_line
    assert "the 5 heaviest of 32 layers" in lines[0]


def test_console_all_and_default(profile):
    every = _table_lines(console.render(profile, top=None), 1)
    assert [line.split()[0] for line in every[2:34]] == [n for n, _, _ in NAMES] and "more layers" not in "".join(every)
    default = _table_lines(console.render(profile), 1)
    assert sum("_conv" in line or "_bn" in line or "relu" in line or "out " in line for line in default) == DEFAULT_TOP


def test_console_groups_by_kind_and_block(profile):
    kinds = _table_lines(console.render(profile, group="kind"), 1)
    assert [line.split()[0] for line in kinds[2:5]] == ["conv", "activation", "normalization"]
    assert kinds[2].split()[1] == "8"  # eight convolutions
    conv_seconds = sum(1e-3 * (1 + i) for i, (_, t, _) in enumerate(NAMES) if t == "Conv2D")
    total = conv_seconds + 24e-5
    assert f"{conv_seconds / total:.1%}" in kinds[2]
    block = _table_lines(console.render(profile, group="block", top=3), 8)
    assert [line.split()[0] for line in block[2:5]] == ["conv3_block4", "conv3_block3", "conv3_block2"]
    assert block[5].split()[:5] == ["…", "5", "more", "blocks", "20"]


def test_cli_report_top_all_group(profile, tmp_path):
    profile.save(tmp_path / "p")
    runner = CliRunner()
    top = runner.invoke(cli, ["report", str(tmp_path / "p"), "--top", "4"])
    assert top.exit_code == 0 and "… 28 more layers" in top.stdout
    every = runner.invoke(cli, ["report", str(tmp_path / "p"), "--all"])
    assert every.exit_code == 0 and "more layers" not in every.stdout and "conv2_block1_out" in every.stdout
    block = runner.invoke(cli, ["report", str(tmp_path / "p"), "--group", "block"])
    assert block.exit_code == 0 and "conv3_block4" in block.stdout and "conv3_block4_1_conv" not in block.stdout
    both = runner.invoke(cli, ["report", str(tmp_path / "p"), "--top", "3", "--all"])
    assert both.exit_code == 2 and "--all" in both.stderr and "Traceback" not in both.output


def test_page_draws_the_heaviest_layers_and_tables_every_layer(profile):
    page = html.render(profile, top=6)
    table = page.split('id="layer-table"')[1].split("</table>")[0]
    assert table.count("<tr data-k=") == len(NAMES)
    assert 'data-k="conv2_block1_1_conv conv conv2_block1"' in table
    assert "function tbsSort" in page and "function tbsFilter" in page
    assert "26 more layers" in page and "The 6 heaviest layers (by time) of 32" in page
    assert "activation" in page.split('id="kinds"')[1][:20000]  # ReLU / Activation have their own kind


def test_fold_keeps_every_row_when_few():
    table = pd.DataFrame({"a": [1.0, 2.0]}, index=["x", "y"])
    assert fold(table, 5).shown == ["x", "y"] and not fold(table, 5).folded
    assert fold(table, 1).shown == ["y"] and fold(table, 1).share("a") == pytest.approx(1 / 3)


def test_heaviest_is_in_model_order(profile):
    data = ReportData(profile, top=3)
    assert data.heaviest() == [f"conv3_block{b}_1_conv" for b in (2, 3, 4)]
    assert layer_groups(profile)["kind"].tolist()[2:4] == ["activation", "activation"]


def test_a_device_without_a_batch_gets_no_empty_bar(profile):
    from tbs.report.layers_view import group_figure

    devices = sorted(SPEED)
    summary = profile.summary
    profile.summary = summary[~((summary["device"] == devices[1]) & (summary["batch_size"] == 8))]
    bars = group_figure(ReportData(profile), "kind").data[0].y  # two machines merged: one has no batch 8
    assert f"batch 8 · {devices[0]}" in bars and f"batch 8 · {devices[1]}" not in bars
    assert f"batch 1 · {devices[1]}" in bars
