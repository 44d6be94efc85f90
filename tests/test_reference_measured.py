"""tbs's own GPU rows as the GPU model's third reference source (tbs/predictions/reference/measured.py): which
measured cells become reference rows, described by what work, and that the image classifiers are never fitted on."""

from __future__ import annotations

import pandas as pd

from conftest import ROOT
from tbs.predictions.reference import MIN_SOURCE_ROWS, fit_table, fitted_model, measured, reference_table
from tbs.predictions.work import CONV
from tbs.profiles.profile import load_profile

# ResNet50 as runs 1 and 3 left it (batch 1 timed before the harness fix, 32 and 256 after), kept beside the
# profile run 5 measured again from the start
H200 = ROOT / "profiles" / "h200" / "resnet50" / "inference.before-harness-fix"


def test_gpu_cells_timed_before_the_harness_fix_or_under_one_loop_iteration_are_not_reference_rows():
    profile = load_profile(H200)
    assert measured.stale_batches(profile.samples, "gpu:0") == {1}  # run 1: XLA deleted the empty timing loop
    again = load_profile(H200.with_name("inference"))
    assert measured.stale_batches(again.samples, "gpu:0") == set()  # run 5: every batch with the loop kept
    loop = measured.loop_seconds(profile.samples, "gpu:0")  # per cell: a resumed profile can mix both harnesses
    assert loop[("conv2_block1_2_conv", 1)] == 0.0 and 1e-5 < loop[("conv2_block1_2_conv", 32)] < 5e-5
    rows = measured.measured_rows(profile, [load_profile(ROOT / "profiles" / "cpu" / "resnet50" / "inference")],
                                  "resnet50", "h200", "tf32")
    assert set(rows["batch"]) == {32}  # batch 256 has no CPU profile to describe its work with
    iteration = [loop[(layer, 32)] for layer in rows["layer"]]
    assert rows["check_only"].all() and (rows["measured_seconds"] >= iteration).all() and (rows["ci_low_s"] > 0).all()
    assert "conv2_block1_1_bn" not in set(rows["layer"])  # 2.7 us: under the loop's 22 us an iteration, not resolved
    summary = profile.summary
    shared = summary[(summary["batch_size"] == 32) & summary["shared_with"].notna()]["layer"]
    assert len(shared) > 50 and not set(shared) & set(rows["layer"])  # identical layers: their one cell, one row
    conv = rows[(rows["layer"] == "conv2_block1_2_conv")].iloc[0]
    cpu = load_profile(ROOT / "profiles" / "cpu" / "resnet50" / "inference").summary
    flops = cpu[(cpu["layer"] == "conv2_block1_2_conv") & (cpu["batch_size"] == 32)]["flops"].iloc[0]
    # XLA:GPU counts no FLOPs in cuDNN's custom call: the work is the CPU analysis of the same layer and batch
    assert conv["kind"] == CONV and conv["flops"] == flops and (conv["m"], conv["n"], conv["window"]) == (32 * 56 * 56, 64, 9)
    work = measured.works_of(rows[rows["layer"] == "conv2_block1_2_conv"])[0]
    assert work.winograd and work.kind == CONV and work.k == 9 * 64


def test_the_image_classifiers_are_scored_but_never_fitted_on_and_a_thin_source_waits():
    table = reference_table()
    own = table[table["source"] == measured.SOURCE]
    assert set(own.loc[own["check_only"], "model"]) == {"resnet50", "efficientnetb0"} and not own.loc[~own["check_only"]].empty
    assert set(own["device"]) == {"h200"}
    sample = table.iloc[::7]
    grown = pd.concat([sample] + [own.assign(check_only=False, model=f"copy{i}") for i in range(20)], ignore_index=True)
    fitted = fit_table(grown)  # tbs's rows, 20 times over: past MIN_SOURCE_ROWS, a source of its own
    assert "tbs" in fitted.source_log_scale
    shifted = grown.copy()
    shifted.loc[shifted["model"] == "resnet50", "measured_s"] *= 100.0  # what a fit on the check would follow
    shifted.loc[shifted["model"] == "resnet50", "check_only"] = True
    assert fit_table(shifted).constants() == fit_table(grown[grown["model"] != "resnet50"]).constants()
    # Today's few rows: scored, not fitted on, in what tbs predict ships (fitted.json: the fit of these files,
    # test_gpu_model pins its digest; fitting the whole table again here took 10 s).
    assert (~own["check_only"]).sum() < MIN_SOURCE_ROWS and "tbs" not in fitted_model().source_log_scale
