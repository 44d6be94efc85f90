"""The prepared GPU run (benchmarks/gpu/drive.py, docs/gpu-run.md): its plan, its refusal without a GPU,
its wall budgets and its packing within what a device call brings back. No framework, no GPU; the whole
CPU dry run is the slow test at the end."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_drive", ROOT / "benchmarks" / "gpu" / "drive.py")
drive = importlib.util.module_from_spec(spec)
sys.modules["gpu_drive"] = drive  # dataclasses look their module up
spec.loader.exec_module(drive)


def _settings(tmp_path: Path, dry_run: bool) -> object:
    gpu = "cpu-dry-run" if dry_run else "h100"
    return drive.Settings(dry_run, tmp_path, gpu, drive.catalog_prices(dry_run, gpu))


def _option(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _profiles(steps: list) -> dict[str, tuple[str, ...]]:
    """Every profile the plan runs: its name -> its `tbs profile` arguments."""
    return {name: args for st in steps for name, args in st.parts}


def test_the_gpu_plan_has_every_step_of_the_issue_in_priority_order(tmp_path: Path) -> None:
    steps = drive.plan(_settings(tmp_path, dry_run=False))
    profiles = _profiles(steps)
    for model in drive.EXAMPLES:
        for mode in ("inference", "training"):
            args = profiles[f"{model}/{mode}"]
            assert (_option(args, "--batch"), _option(args, "--devices")) == ("32,512", "gpu,cpu")  # the GPU first
            assert ("--training" in args) == (mode == "training") and _option(args, "--backend") == "jax"
    for model in ("resnet50", "efficientnetb0"):
        assert (_option(profiles[f"{model}/inference"], "--batch"), _option(profiles[f"{model}/inference"],
                "--devices")) == ("1,32,256", "gpu")
        assert _option(profiles[f"{model}/inference-cpu"], "--devices") == "cpu"
    assert "--training" in profiles["bert_base/training"] and _option(profiles["bert_base/inference"], "--batch") == "32"
    assert "--capacity" in profiles["cnn_flowers/capacity"]
    names = [st.name for st in steps]
    assert names[:5] == ["build", "trace-check", "cnn_flowers/inference", "cnn_flowers/verify", "resnet50/inference"]
    assert all(st.budget_s >= st.estimate_s + 20 for st in steps)
    # the first steps fit the issue's 7 minutes on the H200's times; the rest run if time is left, or next time
    assert [st.name for st in drive._within(steps, 420 - drive.PACK_RESERVE_S)] == names[:5]
    gpu_price = float(_option(profiles["cnn_flowers/inference"], "--cost").split("gpu=")[1])
    assert gpu_price == pytest.approx(11.06, abs=0.01)  # the catalog's H100 price, not a made-up one


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L4", "l4")])
def test_the_profiles_folder_is_named_after_the_gpu(name: str, slug: str) -> None:
    assert drive.gpu_slug(name) == slug


def test_the_dry_run_is_the_same_steps_on_the_cpu_with_small_batches(tmp_path: Path) -> None:
    real, dry = drive.plan(_settings(tmp_path, False)), drive.plan(_settings(tmp_path, True))
    assert [st.name for st in real] == [st.name for st in dry]
    assert list(_profiles(real)) == list(_profiles(dry))
    for args in _profiles(dry).values():
        assert _option(args, "--devices") == "cpu"
        assert max(int(b) for b in _option(args, "--batch").split(",")) <= 4
    assert "--small" in dry[0].argv and "--small" not in real[0].argv
    verify = next(st for st in dry if st.name == "cnn_flowers/verify")
    assert dict(verify.env)["TBS_LOGICAL_CPUS"] == "2"  # two logical CPUs stand in for cpu + gpu


def test_profiles_run_together_keep_their_own_budgets(tmp_path: Path) -> None:
    step = next(st for st in drive.plan(_settings(tmp_path, False)) if st.name == "examples/training")
    runs = json.loads(step.argv[-1])
    # cnn_flowers last: its host CPU's batch-512 cells spent two runs' budgets before the small models got theirs
    assert [r["name"] for r in runs] == [f"{m}/training" for m in drive.EXAMPLES if m != "cnn_flowers"] + [
        "cnn_flowers/training"]
    assert step.budget_s == pytest.approx(drive.PROCESS_START_S + sum(r["budget_s"] for r in runs), abs=1)
    assert step.estimate_s < sum(drive.PROCESS_START_S + drive.GPU_ESTIMATE_S[r["name"]] for r in runs)


def _earlier(root: Path, name: str, status: str, failed: bool = False) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"status": status}))
    (folder / "summary.csv").write_text("layer,status\nlstm,error\n" if failed else "layer,status\ndense,ok\n")


def test_a_run_resumes_an_earlier_runs_profiles_and_leaves_out_what_it_finished(tmp_path: Path) -> None:
    earlier = tmp_path / "h200"
    _earlier(earlier, "nn_twins/inference", "complete")
    _earlier(earlier, "rnn_sa/inference", "complete", failed=True)  # the host CPU's LSTM: measured again
    _earlier(earlier, "resnet50/inference", "interrupted")
    _earlier(earlier, "bert_base/inference", "complete")
    _earlier(earlier, "bert_base/training", "complete")
    (earlier / "cnn_flowers").mkdir()
    (earlier / "cnn_flowers" / "verify.json").write_text("{}")
    s = drive.Settings(False, tmp_path / "work", "h200", drive.catalog_prices(False, "h200"), earlier=earlier)
    steps = drive.plan(s)
    profiles = _profiles(steps)
    assert "nn_twins/inference" not in profiles and "cnn_flowers/verify" not in [st.name for st in steps]
    assert "bert_base/inference+training" not in [st.name for st in steps]  # every part finished
    assert "--resume" in profiles["rnn_sa/inference"] and "--resume" in profiles["resnet50/inference"]
    assert "--resume" not in profiles["cnn_flowers/inference"]  # not in the earlier run: from the start
    assert next(st for st in steps if st.name == "examples/inference").note == "rnn_mnist, rnn_sa, lstm_sunspots"
    drive.execute([], s, "NVIDIA H200", tmp_path / "out", total_s=60.0)  # copied in, to be finished and packed again
    copied = s.work / "profiles" / "h200" / "resnet50" / "inference"
    assert (copied / "summary.csv").is_file()
    # the rebuilt model's pickle differs (Keras's save time): the profile is pointed at it, or --resume refuses it
    (copied / "metadata.json").write_text(json.dumps({"status": "interrupted", "model": {"sha256": "measured"}}))
    (s.work / "models").mkdir()
    (s.work / "models" / "resnet50.pkl").write_bytes(b"rebuilt")
    adopted = drive.adopt_rebuilt_models(s.work / "profiles" / "h200", s.work / "models")
    assert [a["profile"] for a in adopted] == ["resnet50/inference"] and adopted[0]["measured_with_sha256"] == "measured"
    assert json.loads((copied / "metadata.json").read_text())["model"]["sha256"] == adopted[0]["rebuilt_sha256"]


def test_without_a_gpu_it_says_so_in_one_line_and_exits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(drive.shutil, "which", lambda name: None)  # no nvidia-smi, as on CI
    assert drive.main(["--out", str(tmp_path / "out")]) == drive.NO_GPU_EXIT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("no GPU: no nvidia-smi") and "--dry-run" in err
    assert not (tmp_path / "out").exists()


def test_a_step_past_its_budget_gets_ctrl_c_first_and_keeps_what_it_wrote(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drive, "MIN_STEP_S", 0.1)
    keeper = ("import signal, sys, time, pathlib\n"
              "def stop(*_):\n    pathlib.Path(sys.argv[1]).write_text('rows kept'); sys.exit(130)\n"
              "signal.signal(signal.SIGINT, stop)\nprint('measuring', flush=True)\ntime.sleep(60)\n")
    step = drive.Step("slow/inference", (sys.executable, "-c", keeper, str(tmp_path / "kept")), 1.0, 1.0)
    started = time.monotonic()
    outcome = drive.run_step(step, 100.0, print, tmp_path / "steps.log")
    assert outcome.status == "cut" and time.monotonic() - started < 10
    assert (tmp_path / "kept").read_text() == "rows kept"
    assert "measuring" in (tmp_path / "steps.log").read_text()
    assert drive.run_step(step, 0.05, print, tmp_path / "steps.log").status == "skipped"


def test_the_run_packs_each_group_as_it_goes_within_the_device_calls_limits(tmp_path: Path) -> None:
    s = _settings(tmp_path / "work", dry_run=True)
    writer = ("import pathlib, sys\nd = pathlib.Path(sys.argv[1]); d.mkdir(parents=True)\n"
              "(d / 'summary.csv').write_text('layer\\n'); (d / 'report.html').write_text('x' * 1000)\n")
    profiles = s.work / "profiles" / s.gpu
    steps = [drive.Step(name, (sys.executable, "-c", writer, str(profiles / name)), 1.0, 30.0, parts=((name, ()),))
             for name in ("cnn_flowers/inference", "rnn_sa/training", "bert_base/inference", "resnet50/inference")]
    failing = drive.Step("nn_twins/inference", (sys.executable, "-c", "raise SystemExit('boom')"), 1.0, 30.0,
                         parts=(("nn_twins/inference", ()),))
    out = tmp_path / "out"
    assert drive.execute([*steps, failing], s, "cpu", out, total_s=600.0) == 1  # one step failed
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= drive.MAX_FILES and len(drive.GROUPS) + 3 <= drive.MAX_FILES
    assert files == ["environment.json", "profiles-bert_base.tar.gz", "profiles-examples.tar.gz",
                     "profiles-resnet50.tar.gz", "run.log", "steps.log"]
    with tarfile.open(out / "profiles-examples.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert "cpu-dry-run/cnn_flowers/inference/summary.csv" in names
    assert "cpu-dry-run/rnn_sa/training/summary.csv" in names and not any("report.html" in n for n in names)
    log = (out / "run.log").read_text()
    assert "nn_twins/inference: failed" in log and "boom" in log and "done: 4/5 steps ok" in log


def test_a_run_out_of_total_time_skips_the_rest(tmp_path: Path) -> None:
    s = _settings(tmp_path / "work", dry_run=True)
    steps = [drive.Step(f"m{i}/inference", (sys.executable, "-c", "pass"), 1.0, 30.0) for i in range(2)]
    drive.execute(steps, s, "cpu", tmp_path / "out", total_s=drive.PACK_RESERVE_S + drive.MIN_STEP_S - 1)
    assert "m0/inference: skipped" in (tmp_path / "out" / "run.log").read_text()


@pytest.mark.slow
def test_the_whole_dry_run_finishes_on_the_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu/run.sh --dry-run: every step of the GPU run, on this CPU (minutes; TBS_GPU_DRY_RUN=1)."""
    if os.environ.get("TBS_GPU_DRY_RUN") != "1":
        pytest.skip("the whole dry run takes minutes: TBS_GPU_DRY_RUN=1 pytest tests/test_gpu_run.py")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--dry-run"], capture_output=True,
                          text=True, env=dict(os.environ, OUT=str(out)), timeout=3600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tar.gz")) == [
        f"profiles-{g}.tar.gz" for g in sorted(drive.GROUPS)]


def _samples(folder: Path, harness_iteration_s: dict[int, float]) -> None:
    """A samples.csv whose GPU batches' timing loop read these seconds an iteration (the host CPU's read 1 us)."""
    lines = ["device,batch_size,harness_iteration_s"]
    for batch, seconds in harness_iteration_s.items():
        lines += [f"gpu:0,{batch},{seconds}"] * 3 + [f"cpu:0,{batch},1e-06"]
    (folder / "samples.csv").write_text("\n".join(lines) + "\n")


def test_a_profile_timed_before_the_harness_fix_is_measured_again_and_its_rows_kept_beside_it(tmp_path: Path) -> None:
    earlier = tmp_path / "h200"
    _earlier(earlier, "nn_twins/inference", "complete")
    _samples(earlier / "nn_twins" / "inference", {32: 0.0, 512: 2.2e-5})  # batch 32 timed when XLA deleted the loop
    _earlier(earlier, "rnn_mnist/inference", "complete")
    _samples(earlier / "rnn_mnist" / "inference", {32: 2.2e-5, 512: 2.1e-5})
    assert drive.loop_deleted(earlier / "nn_twins" / "inference")
    assert not drive.loop_deleted(earlier / "rnn_mnist" / "inference")
    s = drive.Settings(False, tmp_path / "work", "h200", drive.catalog_prices(False, "h200"), earlier=earlier)
    profiles = _profiles(drive.plan(s))
    assert "rnn_mnist/inference" not in profiles  # finished after the fix: left out
    assert "--resume" not in profiles["nn_twins/inference"]  # from the start, not resumed onto the loop's rows
    step = drive.Step("nn_twins/inference", (sys.executable, "-c", "pass"), 1.0, 30.0, "gpu,cpu", "32,512", "", (),
                      (("nn_twins/inference", profiles["nn_twins/inference"]),))
    drive.execute([step], s, "NVIDIA H200", tmp_path / "cut", total_s=1.0)  # no time left: skipped, put back
    assert (s.work / "profiles" / "h200" / "nn_twins" / "inference" / "samples.csv").is_file()
    drive.execute([step], s, "NVIDIA H200", tmp_path / "ran", total_s=120.0)  # ran, but never reached the profile
    assert not (s.work / "profiles" / "h200" / "nn_twins" / ("inference" + drive.SET_ASIDE)).exists()
    writes = f"import os; os.makedirs({str(s.work / 'profiles' / 'h200' / 'nn_twins' / 'inference')!r})"
    step = dataclasses.replace(step, argv=(sys.executable, "-c", writes))
    drive.execute([step], s, "NVIDIA H200", tmp_path / "out", total_s=120.0)
    kept = s.work / "profiles" / "h200" / "nn_twins" / ("inference" + drive.SET_ASIDE)
    assert (kept / "samples.csv").read_text() == (earlier / "nn_twins" / "inference" / "samples.csv").read_text()
    with tarfile.open(tmp_path / "out" / "profiles-examples.tar.gz") as tar:
        assert f"h200/nn_twins/inference{drive.SET_ASIDE}/samples.csv" in tar.getnames()


def test_a_profile_measured_again_is_verified_again_and_the_earlier_verify_kept_beside_it(tmp_path: Path) -> None:
    """The first runs' verify replayed each layer as its own call; a split now runs one program per run of layers
    on one device. A verify.json beside a profile that is measured again is measured again too, never deleted."""
    earlier = tmp_path / "h200"
    _earlier(earlier, "cnn_flowers/inference", "complete")
    (earlier / "cnn_flowers" / "verify.json").write_text('{"run": 1}')
    s = drive.Settings(False, tmp_path / "work", "h200", drive.catalog_prices(False, "h200"), earlier=earlier)
    assert "cnn_flowers/verify" not in [st.name for st in drive.plan(s)]  # verified with the profile it keeps
    _samples(earlier / "cnn_flowers" / "inference", {32: 0.0})
    verify = next(st for st in drive.plan(s) if st.name == "cnn_flowers/verify")
    assert verify.replaces == ("cnn_flowers/verify.json",) and "verified again" in verify.note
    here = s.work / "profiles" / "h200" / "cnn_flowers"
    writes = f"open({str(here / 'verify.json')!r}, 'w').write('{{}}')"  # what verify.py does
    step = drive.Step(verify.name, (sys.executable, "-c", writes), 1.0, 30.0, replaces=verify.replaces)
    drive.execute([step], s, "NVIDIA H200", tmp_path / "out", total_s=120.0)
    assert (here / f"verify.json{drive.SET_ASIDE}").read_text() == '{"run": 1}'
    with tarfile.open(tmp_path / "out" / "profiles-examples.tar.gz") as tar:  # packed after the step
        assert {"h200/cnn_flowers/verify.json", f"h200/cnn_flowers/verify.json{drive.SET_ASIDE}"} <= set(tar.getnames())


def test_only_picks_whole_steps_or_single_profiles_of_a_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a session's last minutes on the GPU: two profiles of examples/training and one whole step, not cnn_flowers'
    assert drive.main(["--plan", "--work", str(tmp_path), "--only",
                       "rnn_sa/training,lstm_sunspots/training,efficientnetb0/inference"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    steps = {r[0]: r for r in rows if r and r[0] in {"build", "examples/training", "efficientnetb0/inference"}}
    assert set(steps) == {"build", "examples/training", "efficientnetb0/inference"}
    assert " ".join(steps["examples/training"][-2:]) == "rnn_sa, lstm_sunspots"
    assert not any(r and r[0] in {"trace-check", "cnn_flowers/inference", "cpu-extras"} for r in rows)
