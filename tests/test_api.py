"""The Python API on real TensorFlow: what a notebook user calls, and the result objects it returns."""

from __future__ import annotations

import importlib.util
import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from keras_models import keras, sequential_model
import tbs
from tbs.errors import ProfileError, TbsError
from tbs.schema import FORMAT_VERSION

FAST = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)


def quick(model, **options):
    options.setdefault("timing", FAST)
    options.setdefault("progress", None)
    return tbs.profile(model, **options)


@pytest.fixture(scope="module")
def in_memory_profile():
    with warnings.catch_warnings():  # gpu=3 on a machine without one: said (tests/test_cli.py), priced nowhere
        warnings.filterwarnings("ignore", message=".*prices nothing in this profile", category=tbs.TbsWarning)
        return quick(sequential_model(), batch_sizes=[4, 8], prices={"cpu": 0.5, "gpu": 3})


def test_in_memory_model_profiles_into_a_temporary_directory(in_memory_profile):
    p = in_memory_profile
    assert isinstance(p, tbs.Profile) and p.complete
    assert isinstance(p.summary, pd.DataFrame) and isinstance(p.model, pd.DataFrame)
    assert sorted(p.summary["layer"].unique()) == ["dense", "dense_1", "dropout"]
    assert sorted(p.summary["batch_size"].unique()) == [4, 8]
    assert p.metadata["model"]["format"] == "in-memory" and p.metadata["model"]["path"] is None
    assert p.directory.name.startswith("tbs-") and (p.directory / "report.html").is_file()
    assert p.summary["cost_per_sample_usd"].notna().all()  # priced through a dict, like --cost


def test_repr_html_is_a_compact_table_not_every_cell(in_memory_profile):
    page = in_memory_profile._repr_html_()
    assert page.count("<tr") == 1 + len(in_memory_profile.model)  # header + one row per device x batch
    assert "tiny_seq" in page and "dense_1" not in page
    assert "tiny_seq" in repr(in_memory_profile)


def test_save_then_load_round_trips(in_memory_profile, tmp_path):
    saved = in_memory_profile.save(tmp_path / "kept")
    again = tbs.load(saved)
    assert again.complete and len(again.summary) == len(in_memory_profile.summary)
    assert (saved / "report.html").is_file()
    repriced = tbs.load(saved, prices={"cpu": 1.0})
    before, after = again.summary["cost_per_sample_usd"], repriced.summary["cost_per_sample_usd"]
    assert np.allclose(after[before > 0] / before[before > 0], 2.0) and after.notna().all()


def test_recommend_and_render_every_format(in_memory_profile):
    rec = tbs.recommend(in_memory_profile, objective="time")
    assert list(rec.placement.columns[:2]) == ["layer", "device"]
    assert set(rec.placement["device"]) == {"cpu:0"}
    html = tbs.render(in_memory_profile, "html", recommendation=rec)
    assert html.startswith("<!DOCTYPE html>") and "Recommended placement" in html
    text = tbs.render(in_memory_profile, "text", recommendation=rec)
    assert "batch 4: time per sample" in text and "Placement for batch 8" in text
    payload = json.loads(tbs.render(in_memory_profile, "json", recommendation=rec))
    assert payload["recommendation"]["batch_size"] == 8 and payload["profile"]["layers"]
    csv = tbs.render(in_memory_profile, "csv")
    assert csv.splitlines()[0].startswith("layer,layer_type")
    with pytest.raises(TbsError, match="format 'pdf'"):
        tbs.render(in_memory_profile, "pdf")


def test_arrays_as_input_and_a_callback_for_progress():
    seen = []
    data = np.random.default_rng(0).random((5, 6), dtype=np.float32)
    p = quick(sequential_model(), batch_sizes=[3], input=data, progress=lambda label, left: seen.append(left))
    assert p.metadata["input_source"].startswith("in-memory arrays")
    assert any(left is not None for left in seen) and seen[-1] is not None and seen[-1] < 1.0


def test_devices_says_what_is_missing_and_why():
    table = tbs.devices(backend="tensorflow")
    assert {"backend", "device", "kind", "available", "reason"} <= set(table.columns)
    assert (table["device"] == "cpu:0").any()
    missing = table[~table["available"]]
    assert missing["reason"].str.len().gt(0).all()  # every missing kind says why


def test_bad_arguments_are_one_line_errors_before_any_work(tmp_path):
    with pytest.raises(TbsError, match="batch_sizes=0: must be at least 1"):
        tbs.profile("models/x.pkl", batch_sizes=[0])
    with pytest.raises(TbsError, match="does not exist"):
        tbs.profile(tmp_path / "missing.pkl")
    with pytest.raises(TbsError, match="neither a model file path nor a keras.Model"):
        tbs.profile(42)
    with pytest.raises(TbsError, match="unknown device 'npu'"):
        tbs.profile(sequential_model(), devices="npu")
    with pytest.raises(TbsError, match="backend 'jax'"):  # the in-memory model lives on TensorFlow here
        tbs.profile(sequential_model(), backend="jax")


def test_skipped_device_is_a_warning(seq_pkl, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quick(seq_pkl, batch_sizes=[2], devices=["cpu", "gpu"], out=tmp_path / "p", report=False)
    assert any(issubclass(w.category, tbs.TbsWarning) and "skipping gpu" in str(w.message) for w in caught)


def test_a_profile_directory_is_locked_while_measuring(seq_pkl, tmp_path):
    from tbs.profiles.store import ProfileStore

    holder = ProfileStore(tmp_path / "p")
    holder.lock()
    try:
        with pytest.raises(ProfileError, match=r"being measured by tbs process \d+"):
            quick(seq_pkl, batch_sizes=[2], out=tmp_path / "p")
    finally:
        holder.unlock()
    assert quick(seq_pkl, batch_sizes=[2], out=tmp_path / "p", report=False).complete  # free again


def test_a_profile_from_a_newer_tbs_is_refused_with_the_writer(in_memory_profile, tmp_path):
    saved = in_memory_profile.save(tmp_path / "p")
    meta = json.loads((saved / "metadata.json").read_text())
    assert meta["tbs_profile_version"] == FORMAT_VERSION == 7 and meta["tbs_version"]
    meta.update(tbs_profile_version=99, tbs_version="9.0")
    (saved / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ProfileError, match="format 99, written by tbs 9.0"):
        tbs.load(saved)
    meta["tbs_profile_version"] = 6  # format 6 (before metadata values were checked) still reads
    (saved / "metadata.json").write_text(json.dumps(meta))
    assert tbs.load(saved).complete
    del meta["tbs_profile_version"]  # a format-1 profile (tbs 0.1 wrote no version check) still reads
    (saved / "metadata.json").write_text(json.dumps(meta))
    assert tbs.load(saved).complete


def test_merge_refuses_profiles_measured_in_different_modes(in_memory_profile, tmp_path):
    a = in_memory_profile.save(tmp_path / "a")
    b = in_memory_profile.save(tmp_path / "b")
    meta = json.loads((b / "metadata.json").read_text())
    meta["mode"] = "training"
    (b / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ProfileError, match="mode 'training'.*same mode"):
        tbs.load(a, b)


@pytest.mark.slow
def test_readme_python_example_runs_in_a_notebook_kernel(tmp_path):
    """The README's notebook example, cell by cell, in a real Jupyter kernel: the profile shows as a table.

    As written but for speed: fast statistics, small batch sizes, a temporary profile directory.
    """
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    if not (ROOT / "models" / "cnn_flowers.pkl").exists():  # built here: this process has TensorFlow started
        spec = importlib.util.spec_from_file_location("example_models", ROOT / "models" / "build.py")
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        builder.build("cnn_flowers")
    setup = "import os; os.chdir(%r); import tbs\n" % str(ROOT)
    fast = "_fast = tbs.TimingConfig(min_samples=3, cell_budget_seconds=0.05, min_block_seconds=0.001, min_span_seconds=0.0)\n"
    assert "batch_sizes=[32, 512]" in example
    code = example.replace("tbs.profile(", "tbs.profile(timing=_fast, progress=None, out=%r, model=" % str(tmp_path / "nb"))
    code = code.replace("batch_sizes=[32, 512]", "batch_sizes=[2, 4]").replace("profiles/cnn_flowers_api", str(tmp_path / "kept"))
    cells = [nbformat.v4.new_code_cell(setup + fast)]
    cells += [nbformat.v4.new_code_cell(block) for block in code.split("\n\n") if block.strip()]
    notebook = nbformat.v4.new_notebook(cells=cells)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3").execute()
    shown = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "execute_result"]
    assert any("text/html" in o["data"] and "tbs profile of cnn_flowers" in o["data"]["text/html"] for o in shown)


@pytest.mark.parametrize("call, message", [
    (lambda: tbs.profile("m.pkl", batch_sizes=None), "batch_sizes=None"),
    (lambda: tbs.profile("m.pkl", batch_sizes="32"), "batch_sizes='32'"),
    (lambda: tbs.profile("m.pkl", devices=5), "devices=5"),
    (lambda: tbs.profile("m.pkl", timing={"min_samples": 3}), "timing=dict"),
    (lambda: tbs.profile("m.pkl", custom_objects=5), "custom_objects=5"),
    (lambda: tbs.profile("m.pkl", measure=tbs.MeasureConfig(seed="x")), "seed='x'"),
    (lambda: tbs.profile("m.pkl", training="yes"), "training='yes'"),
    (lambda: tbs.profile("m.pkl", prices={"cpu=1,gpu": 2}), "unknown device 'cpu=1,gpu'"),
    (lambda: tbs.profile("m.pkl", prices={"cpu": "abc"}), "prices: price 'abc' for cpu"),
    (lambda: tbs.profile("m.pkl", resume=True), "resume=True needs"),
    (lambda: tbs.render(42), "neither a tbs.Profile nor a profile directory"),
    (lambda: tbs.TimingConfig(min_samples=0), "min_samples=0"),
])
def test_wrong_types_and_values_are_one_line_errors(call, message):
    with pytest.raises(TbsError, match=re.escape(message)) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_repricing_names_some_devices_and_keeps_the_rest(in_memory_profile, tmp_path):
    saved = in_memory_profile.save(tmp_path / "p")
    for bad, message in (({"cpu": 5}, "discount '5' for cpu"), ({"cpu": "x"}, "discount 'x'")):
        with pytest.raises(TbsError, match=message):
            tbs.load(saved, spot=bad)
    kept = tbs.load(saved, prices={"gpu": 2.5})  # the CPU keeps its profiled 0.5 $/h
    assert (kept.summary["usd_per_hour"] == 0.5).all() and kept.metadata["prices_usd_per_hour"]["gpu"] == 2.5
    spot = tbs.load(saved, spot={"cpu": 0.5})
    assert np.allclose(spot.summary["usd_per_hour"], 0.25)
    with pytest.raises(TbsError, match=r"max_latency_ms=-1.*--max-latency"):
        tbs.recommend(saved, "cost", max_latency_ms=-1)
    with pytest.raises(TbsError, match=r"batch size 16 \(--batch\) is not in this profile"):
        tbs.recommend(saved, "time", batch_size=16)


def test_ctrl_c_returns_what_was_measured_and_resume_finishes_it(tmp_path):
    """A real SIGINT mid-run: the first stops after the current sample, the profile is kept, resume completes it."""
    import signal

    sent = []

    def interrupt_once(label, remaining):
        if remaining is not None and "dense" in str(label) and not sent:
            sent.append(label)
            signal.raise_signal(signal.SIGINT)

    out = tmp_path / "p"
    model = sequential_model()
    partial = quick(model, batch_sizes=[2, 4, 8], out=out, progress=interrupt_once)
    assert sent and not partial.complete and partial.metadata["status"] == "interrupted"
    assert 0 < len(partial.summary) < 9 and not (out / "report.html").exists()
    finished = quick(model, batch_sizes=[2, 4, 8], out=out, resume=True)
    assert finished.complete and len(finished.summary) == 9
    kept = partial.summary.merge(finished.summary, on=["layer", "batch_size"], suffixes=("", "_after"))
    assert (kept["median_s"] == kept["median_s_after"]).all()  # not measured again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler was put back


def test_safe_mode_false_reaches_the_loader(tmp_path):
    inp = keras.Input((3,), name="x")
    model = keras.Model(inp, keras.layers.Lambda(lambda v: v * 2.0, name="double")(keras.layers.Dense(2)(inp)))
    path = tmp_path / "lambda.keras"
    model.save(path)
    with pytest.raises(TbsError, match="--no-safe-mode"):
        quick(path, batch_sizes=[2], out=tmp_path / "refused")
    p = quick(path, batch_sizes=[2], out=tmp_path / "p", safe_mode=False, report=False)
    assert "double" in set(p.summary["layer"])


def test_verify_an_in_memory_profile_by_passing_the_model_again(monkeypatch):
    monkeypatch.setenv("TBS_LOGICAL_CPUS", "1")
    model = sequential_model()
    p = quick(model, batch_sizes=[4], report=False)
    rec = tbs.recommend(p, "time")
    with pytest.raises(TbsError, match=r"pass it again \(tbs.verify\(p, rec, model=model\)\)"):
        tbs.verify(p, rec)
    result = tbs.verify(p, rec, model=model)
    assert rec.verification is result and result.layers == 3
    assert {"placement", "measured_seconds_per_sample", "relative_error"} <= set(result.table.columns)
