"""The GPU run of issue 29: one short, known-good use of a GPU machine, prepared and rehearsed on the CPU.

    benchmarks/gpu/run.sh                        # on the GPU machine: installs the carried wheels, then this
    python benchmarks/gpu/drive.py --out DIR     # every step below on --backend jax, cpu and gpu
    python benchmarks/gpu/drive.py --out DIR --dry-run   # the same steps on the CPU, small batches and sizes
    python benchmarks/gpu/drive.py --plan [--dry-run]    # print the plan only

It builds the models on the machine (Keras on JAX, no TensorFlow), then runs each step as its own
process with a wall budget: at the budget the step gets Ctrl-C (tbs keeps every row it wrote and
marks the profile interrupted), 15 s later it is killed. A total budget (default 420 s) skips the
steps that no longer fit, lowest priority last in the plan. After each step its profiles (without
report.html, which `tbs report` re-makes) are packed into DIR/profiles-<group>.tar.gz (4 groups),
beside run.log, steps.log (every step's own output) and environment.json: 7 files, each far under
the 16 MiB a device call brings back.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
# GROUPS and MAX_FILES are read by the tests through this module
from records import (EXAMPLES, GROUPS, MAX_FILE_BYTES, MAX_FILES, adopt_rebuilt_models, environment_record,  # noqa: E402,F401
                     SET_ASIDE, failed_cells, groups_of, loop_deleted, pack, set_aside)
PYTHON = sys.executable
KILL_GRACE_S = 15.0  # after Ctrl-C, how long a step may take to write its last rows
PACK_RESERVE_S = 15.0  # kept back from the total budget for packing
MIN_STEP_S = 20.0  # a step with less time than this left is skipped, not started
NO_GPU_EXIT = 3
TOTAL_S = 420.0  # the 7 minutes on the GPU

# Statistics: a dedicated machine drifts little, so a (device, batch) group's samples need not span
# the default 2 s; the dry run asks for the minimum that still exercises every code path.
GPU_TIMING = ("--min-span-seconds", "0.5", "--max-cell-seconds", "1", "--min-block-ms", "5")
DRY_TIMING = ("--min-samples", "3", "--min-span-seconds", "0.05", "--max-cell-seconds", "0.1", "--min-block-ms", "2")
DRY_BUDGET_SCALE = 6.0  # the rehearsal's 2-core machine, shared with other work, runs the steps ~3-6x slower
DRY_BATCH = {1: 1, 32: 2, 256: 2, 512: 4}  # the dry run's stand-in for each real batch size

# Seconds of each part on the GPU machine, its process start apart (PROCESS_START_S), from the first run on an
# H200 (profiles/h200/runs/, 2026-11-27), which took 2-5x the datasheet estimates made before it: each unique
# cell (dedupe measures identical calls once) costs about 1.1 s on the GPU (compile, XLA's analysis, warm-up,
# 10+ samples of 5 ms blocks; a call's dispatch there is ~0.4 ms), so ResNet50's 48 cells took 68 s at batch 1;
# the host CPU's side of a cpu,gpu profile (BERT-base at batch 32: 0.8 s a call) dominates where it is measured.
# Parts cut before they finished are estimated from the share they measured; cnn_flowers' training, from runs 3
# and 4 (two cuts at 154 s and 160 s, the host CPU's batch-512 cells, about 1 s a call, still not finished).
STALE = "measured before the harness fix"  # earlier_status of a profile whose GPU rows carry the timing loop
PROCESS_START_S = 8.0  # Python, JAX's CUDA client, Keras and tbs, in each step's process
GPU_ESTIMATE_S: dict[str, float] = {
    "build": 40, "trace-check": 5, "cnn_flowers/inference": 55, "cnn_flowers/verify": 10, "resnet50/inference": 190,
    "bert_base/inference": 70, "bert_base/training": 60,
    "rnn_mnist/inference": 21, "rnn_sa/inference": 30, "nn_twins/inference": 8, "lstm_sunspots/inference": 35,
    "cnn_flowers/training": 400, "rnn_mnist/training": 26, "rnn_sa/training": 60, "nn_twins/training": 22,
    "lstm_sunspots/training": 60, "cnn_flowers/capacity": 18, "efficientnetb0/inference": 430,
    "bert_base/training-cpu": 60, "resnet50/inference-cpu": 100, "efficientnetb0/inference-cpu": 150,
}


@dataclass(frozen=True)
class Step:
    """One process of the run: what it runs, its wall budget and the estimate the plan shows."""

    name: str
    argv: tuple[str, ...]
    estimate_s: float
    budget_s: float
    devices: str = ""
    batches: str = ""
    note: str = ""
    env: tuple[tuple[str, str], ...] = ()
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (name, tbs arguments) of each profile it runs
    replaces: tuple[str, ...] = ()  # files of the earlier run it writes again: set aside first, never deleted


@dataclass
class Outcome:
    name: str
    status: str  # ok, failed (rc), cut (budget reached), skipped (no time left)
    seconds: float
    returncode: int | None = None
    detail: str = ""


@dataclass
class Settings:
    """What differs between the GPU run and its CPU rehearsal."""

    dry_run: bool
    work: Path
    gpu: str  # the profiles' folder name: h100, h200, ... or cpu-dry-run
    prices: dict[str, float] = field(default_factory=dict)
    budget_scale: float = 1.0
    earlier: Path | None = None  # --resume-from: an earlier run's profiles (<model>/<mode>/), finished here
    only: frozenset[str] = frozenset()  # --only: step or profile names (model/mode); empty: every one

    def wanted(self, part: str, step: str) -> bool:
        """Whether --only keeps profile ``part`` of ``step`` (named itself, or its whole step named)."""
        return not self.only or part in self.only or step in self.only

    @property
    def devices(self) -> str:
        """The GPU first: a (batch, device) group is measured in this order, so a step cut short keeps the GPU's
        rows (the first H200 run's BERT step spent its budget on the host CPU and measured no GPU cell)."""
        return "cpu" if self.dry_run else "gpu,cpu"

    def earlier_status(self, name: str) -> str | None:
        """The earlier run's profile ``name`` (model/mode): 'complete', another status (finished with --resume),
        or None (not there: measured from the start)."""
        folder = None if self.earlier is None else self.earlier / name
        if folder is None or not (folder / "metadata.json").is_file():
            return None
        status = str(json.loads((folder / "metadata.json").read_text()).get("status"))
        if loop_deleted(folder):  # measured again from the start; the earlier rows are set aside, not resumed
            return STALE
        if status == "complete" and failed_cells(folder):  # tbs profile --resume measures them again
            return "complete with failed cells"
        return status

    @property
    def gpu_only(self) -> str:
        return "cpu" if self.dry_run else "gpu"

    def batches(self, sizes: tuple[int, ...]) -> str:
        chosen = sorted({DRY_BATCH[b] for b in sizes}) if self.dry_run else list(sizes)
        return ",".join(str(b) for b in chosen)

    @property
    def timing(self) -> tuple[str, ...]:
        return DRY_TIMING if self.dry_run else GPU_TIMING

    @property
    def two_devices(self) -> tuple[tuple[str, str], ...]:
        """The dry run's stand-in for cpu + gpu: the host split into two logical CPUs."""
        return (("TBS_LOGICAL_CPUS", "2"),) if self.dry_run else ()

    def cost(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.prices.items())


def catalog_prices(dry_run: bool, gpu: str) -> dict[str, float]:
    """USD/hour from tbs's dated catalog: the GPU's own price (the H100's where it has none: the H200's
    compute is the H100's), and 16 vCPUs at GCP c3-standard-8's price per vCPU for the host CPU."""
    rows = {r["id"]: r for r in csv.DictReader(open(ROOT / "tbs" / "predictions" / "catalog.csv"))}
    cpu = 2 * float(rows["cpu-c3-8"]["usd_per_hour"])
    own = rows.get(gpu, {}).get("usd_per_hour") or rows["h100"]["usd_per_hour"]
    if dry_run:  # the second logical CPU stands in for the GPU
        return {"cpu:0": round(cpu, 4), "cpu:1": round(float(own), 4)}
    return {"cpu": round(cpu, 4), "gpu": round(float(own), 4)}


def _arguments(s: Settings, model: str, mode: str, devices: str, sizes: tuple[int, ...],
               extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`tbs profile` arguments for one model and mode, into WORK/profiles/<gpu>/<model>/<mode>."""
    out = s.work / "profiles" / s.gpu / model / mode
    args = ("profile", str(s.work / "models" / f"{model}.pkl"), "--backend", "jax", "--devices", devices,
            "--batch", s.batches(sizes), "--out", str(out), "--cost", s.cost(), *s.timing, *extra)
    return args + (("--training",) if mode.startswith("training") else ())


def _profile(s: Settings, model: str, mode: str, devices: str, sizes: tuple[int, ...], extra: tuple[str, ...] = (),
             note: str = "", env: tuple[tuple[str, str], ...] = ()) -> Step | None:
    """One profile in a process of its own; None where the earlier run finished it, ``--resume`` where it did not."""
    name, args = f"{model}/{mode}", _arguments(s, model, mode, devices, sizes, extra)
    earlier = s.earlier_status(name)
    if earlier == "complete":
        return None
    if earlier == STALE:
        note = f"{note}{'; ' if note else ''}measured again: the earlier profile's GPU rows carry the timing loop " \
               f"(kept as {mode}{SET_ASIDE})"
    elif earlier is not None:
        args, note = args + ("--resume",), f"{note}{'; ' if note else ''}resumes the earlier run's {earlier} profile"
    estimate = PROCESS_START_S + GPU_ESTIMATE_S[name]
    return Step(name, (PYTHON, "-m", "tbs", *args), estimate, _budget(estimate, s.budget_scale), devices,
                s.batches(sizes), note, env, ((name, args),))


def _together(s: Settings, name: str, parts: list[Step | None], note: str = "") -> Step | None:
    """Several profiles in one process (one start-up), each on its own budget (benchmarks/gpu/in_one_process.py);
    None where the earlier run finished every one."""
    parts = [p for p in parts if p is not None and s.wanted(p.name, name)]
    if not parts:
        return None
    note = note or ", ".join(p.name.split("/")[0] for p in parts)
    runs = [{"name": p.name, "args": list(p.parts[0][1]), "budget_s": p.budget_s - PROCESS_START_S * s.budget_scale}
            for p in parts]
    estimate = PROCESS_START_S + sum(p.estimate_s - PROCESS_START_S for p in parts)
    budget = PROCESS_START_S * s.budget_scale + sum(r["budget_s"] for r in runs)
    argv = (PYTHON, str(ROOT / "benchmarks" / "gpu" / "in_one_process.py"), json.dumps(runs))
    return Step(name, argv, estimate, round(budget), parts[0].devices, parts[0].batches, note, (),
                tuple(p.parts[0] for p in parts))


def _budget(estimate_s: float, scale: float = 1.0) -> float:
    """A step's wall budget: 1.5x its GPU estimate (20 s more at least), times ``scale`` (--budget-scale:
    the CPU rehearsal's 2-core machine compiles and measures several times slower than the GPU machine)."""
    return round(scale * max(1.5 * estimate_s, estimate_s + 20.0))


def _verify(s: Settings) -> Step | None:
    """`tbs recommend --verify` on cnn_flowers; None where the earlier run verified the profile this run keeps. A
    profile measured again is verified again (the earlier replay ran each layer as its own call, before a split
    ran one program per run of layers on one device); the earlier verify.json is set aside beside it."""
    done = s.earlier is not None and (s.earlier / "cnn_flowers" / "verify.json").is_file()
    again = done and s.earlier_status("cnn_flowers/inference") == STALE
    if done and not again:
        return None
    estimate = PROCESS_START_S + GPU_ESTIMATE_S["cnn_flowers/verify"]
    note = "tbs recommend --verify: the mixed placement run for real, predicted against measured"
    return Step("cnn_flowers/verify", (PYTHON, str(ROOT / "benchmarks" / "gpu" / "verify.py"),
                                       str(s.work / "profiles" / s.gpu / "cnn_flowers" / "inference"), s.batches((32,))),
                estimate, _budget(estimate, s.budget_scale), s.devices, s.batches((32,)),
                note + ("; verified again: the profile is measured again (the earlier one kept as verify.json"
                       f"{SET_ASIDE})" if again else ""), s.two_devices,
                replaces=("cnn_flowers/verify.json",) if again else ())


def plan(s: Settings) -> list[Step]:
    """Every step, most valuable first: a run cut short keeps the first ones."""
    models = (*EXAMPLES, "resnet50", "efficientnetb0", "bert_base")
    build_s = GPU_ESTIMATE_S["build"]
    build = Step("build", (PYTHON, str(ROOT / "benchmarks" / "gpu" / "models.py"), str(s.work / "models"), *models,
                           *(("--small",) if s.dry_run else ())), build_s, _budget(build_s, s.budget_scale),
                 note="Keras on JAX's CPU (the GPU untouched); no TensorFlow anywhere",
                 env=(("KERAS_BACKEND", "jax"), ("JAX_PLATFORMS", "cpu")))
    verify = _verify(s)
    trace_s = PROCESS_START_S + GPU_ESTIMATE_S["trace-check"]
    trace = Step("trace-check", (PYTHON, str(ROOT / "benchmarks" / "gpu" / "trace_check.py")), trace_s,
                 _budget(trace_s, s.budget_scale), s.gpu_only,
                 note="a small program's profiler trace as the GPU records it, and what tbs reads from it (steps.log)")
    examples = [m for m in EXAMPLES if m != "cnn_flowers"]
    steps = [
        build,
        trace,
        _profile(s, "cnn_flowers", "inference", s.devices, (32, 512), env=s.two_devices,
                 note="and the GPU's dispatch floor, host<->device copies (every cpu+gpu profile has them)"),
        verify,
        _profile(s, "resnet50", "inference", s.gpu_only, (1, 32, 256)),
        _together(s, "bert_base/inference+training", [
            _profile(s, "bert_base", "inference", s.devices, (32,)),
            _profile(s, "bert_base", "training", s.gpu_only, (32,))], "training on the GPU; its CPU at the end"),
        _together(s, "examples/inference", [_profile(s, m, "inference", s.devices, (32, 512)) for m in examples]),
        _together(s, "examples/training", [_profile(s, m, "training", s.devices, (32, 512))  # cnn_flowers last: it
                                           for m in [*examples, "cnn_flowers"]]),  # spent two runs' budgets
        _profile(s, "cnn_flowers", "capacity", s.gpu_only, (32,), ("--capacity",),
                 "--capacity: the largest batch that fits, by real calls"),
        _profile(s, "efficientnetb0", "inference", s.gpu_only, (1, 32, 256)),
        _together(s, "cpu-extras", [
            _profile(s, "resnet50", "inference-cpu", "cpu", (1, 32)),
            _profile(s, "efficientnetb0", "inference-cpu", "cpu", (1, 32)),
            _profile(s, "bert_base", "training-cpu", "cpu", (32,))], "the host CPU beside the GPU-only profiles"),
    ]
    return [st for st in steps if st is not None]


def plan_text(steps: list[Step], s: Settings, total_s: float) -> str:
    head = "dry run on the CPU (small batches and sizes)" if s.dry_run else f"GPU run ({s.gpu})"
    lines = [f"plan: {head}; total budget {total_s:.0f} s; prices {s.cost()} (USD/h, tbs's catalog)",
             f"{'step':<30} {'devices':<8} {'batches':<10} {'est s':>6} {'budget s':>8}  note"]
    for st in steps:
        lines.append(f"{st.name:<30} {st.devices:<8} {st.batches:<10} {st.estimate_s:>6.0f} {st.budget_s:>8.0f}  {st.note}")
    fits = [st for st in _within(steps, total_s - PACK_RESERVE_S)]
    lines.append(f"{'estimated total':<50} {sum(st.estimate_s for st in steps):>6.0f}; within the budget if the "
                 f"estimates hold: {len(fits)} of {len(steps)} steps ({sum(st.estimate_s for st in fits):.0f} s)")
    lines.append("TensorFlow-only layers: none in these models (rnn_sa reads int tokens, cnn_flowers' augmentation "
                 "is Keras ops); lm_imdb's TextVectorization, which would be recorded unsupported on JAX, is not run")
    return "\n".join(lines)


def _within(steps: list[Step], seconds: float) -> list[Step]:
    """The first steps whose estimates add up to no more than ``seconds``."""
    chosen, used = [], 0.0
    for st in steps:
        if used + st.estimate_s > seconds:
            break
        chosen.append(st)
        used += st.estimate_s
    return chosen


def find_gpu() -> tuple[str | None, str]:
    """(the GPU's short name, its description) or (None, why there is none), without holding GPU memory."""
    if shutil.which("nvidia-smi") is None:
        return None, "no nvidia-smi on this machine"
    query = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    names = [n.strip() for n in query.stdout.splitlines() if n.strip()]
    if query.returncode != 0 or not names:
        return None, f"nvidia-smi lists no GPU ({(query.stderr or query.stdout).strip()[:120]})"
    probe = ("import json, tbs; d = tbs.devices(backend='jax'); g = d[(d.kind == 'gpu')]; "
             "print(json.dumps([int(g.available.sum()), '; '.join(str(r) for r in g.reason.dropna())]))")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    seen = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT)
    try:
        count, reason = json.loads(seen.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"tbs could not list JAX's devices: {(seen.stderr.strip().splitlines() or ['?'])[-1]}"
    if not count:
        return None, f"JAX sees no GPU ({reason or 'no reason given'})"
    return gpu_slug(names[0]), names[0]


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the profiles' folder name."""
    known = re.search(r"\b([HABLVT]\d{1,3}[A-Z]?|RTX ?\d{4})\b", name.upper())
    return (known.group(1) if known else name).lower().replace(" ", "")


def run_step(step: Step, left_s: float, log: Callable[[str], None], out_log: Path) -> Outcome:
    """Run one step within min(its budget, the time left); Ctrl-C at the limit, kill after the grace."""
    limit = min(step.budget_s, left_s)
    if limit < MIN_STEP_S:
        return Outcome(step.name, "skipped", 0.0, detail=f"{left_s:.0f} s left of the total budget")
    env = dict(os.environ, PYTHONUNBUFFERED="1", **dict(step.env))
    start = time.monotonic()
    with open(out_log, "a") as sink:
        sink.write(f"\n===== {step.name}: {' '.join(step.argv)}\n")
        sink.flush()
        proc = subprocess.Popen(step.argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        status = "ok"
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            status = "cut"
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - start
    if status == "ok" and proc.returncode != 0:
        status = "failed"
    detail = "" if status == "ok" else _last_line(out_log)
    return Outcome(step.name, status, round(seconds, 1), proc.returncode, detail)


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where the packed files go ($OUT on the device machine)")
    parser.add_argument("--work", type=Path, default=None,
                        help="models and profiles, this run's scratch (default TMPDIR/tbs-gpu-work)")
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, small batches and sizes")
    parser.add_argument("--plan", action="store_true", help="print the plan and stop")
    parser.add_argument("--total-seconds", type=float, default=None,
                        help=f"the whole run's budget (default {TOTAL_S:g} s, times --budget-scale)")
    parser.add_argument("--budget-scale", type=float, default=None,
                        help=f"multiply every step's budget (default 1, {DRY_BUDGET_SCALE:g} with --dry-run)")
    parser.add_argument("--only", default=None, help="comma-separated step names, or profiles of a step (rnn_sa/training); "
                                                        "default: every step")
    parser.add_argument("--resume-from", type=Path, default=None,
                        help="where earlier runs' profiles are (profiles): those of this GPU (profiles/h200 on an "
                             "H200) that finished are left out, the others resumed (tbs profile --resume) and packed "
                             "again; a GPU with none there is measured from the start")
    args = parser.parse_args(argv)
    gpu, gpu_name = ("cpu-dry-run", platform.processor() or "cpu") if args.dry_run else find_gpu()
    if gpu is None and not args.plan:
        print(f"no GPU: {gpu_name}; this script measures a GPU (--dry-run rehearses it on the CPU)", file=sys.stderr)
        return NO_GPU_EXIT
    gpu = gpu or "h100"
    if args.out is None and not args.plan:
        parser.error("--out DIR is needed")
    work = (args.work or Path(tempfile.gettempdir()) / "tbs-gpu-work").resolve()
    scale = args.budget_scale or (DRY_BUDGET_SCALE if args.dry_run else 1.0)
    total_s = args.total_seconds or TOTAL_S * scale
    if args.resume_from is not None and not args.resume_from.is_dir():
        parser.error(f"--resume-from {args.resume_from}: no such folder (where earlier runs' profiles are: profiles)")
    earlier = args.resume_from / gpu if args.resume_from is not None else None
    if earlier is not None and not earlier.is_dir():
        print(f"no earlier profiles of this GPU in {earlier}: every step from the start", flush=True)
        earlier = None
    s = Settings(args.dry_run, work, gpu, catalog_prices(args.dry_run, gpu), scale,
                 earlier.resolve() if earlier else None, frozenset(args.only.split(",")) if args.only else frozenset())
    steps = [st for st in plan(s) if st.name == "build" or s.wanted(st.name, st.name)
             or any(s.wanted(name, st.name) for name, _ in st.parts)]
    print(plan_text(steps, s, total_s), flush=True)
    if args.plan:
        return 0
    return execute(steps, s, gpu_name, args.out, total_s)


def execute(steps: list[Step], s: Settings, gpu_name: str, out: Path, total_s: float) -> int:
    """Run the steps in order within the total budget, recording as it goes; then pack."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(s.work / "profiles" / s.gpu, ignore_errors=True)  # an earlier run's profiles would be packed too
    s.work.mkdir(parents=True, exist_ok=True)
    if s.earlier is not None:  # finished here with --resume, and packed again with what this run adds
        shutil.copytree(s.earlier, s.work / "profiles" / s.gpu, ignore=shutil.ignore_patterns("runs", "report.html"))
    run_log, env_file = out / "run.log", out / "environment.json"
    started = time.monotonic()

    def log(line: str) -> None:
        stamped = f"[{time.monotonic() - started:6.1f} s] {line}"
        print(stamped, flush=True)
        with open(run_log, "a") as f:
            f.write(stamped + "\n")

    record = environment_record(s.dry_run, s.gpu, gpu_name, s.prices)
    record["plan"] = [asdict(st) for st in steps]
    outcomes: list[Outcome] = []
    for st in steps:
        left = total_s - PACK_RESERVE_S - (time.monotonic() - started)
        log(f"{st.name}: start (estimate {st.estimate_s:.0f} s, budget {min(st.budget_s, max(left, 0)):.0f} s)")
        here = s.work / "profiles" / s.gpu
        aside = [set_aside(here / name) for name, _ in st.parts  # measured again from empty: the earlier rows
                 if s.earlier_status(name) == STALE]  # beside it, packed with it
        aside += [set_aside(here / name) for name in st.replaces if (here / name).exists()]
        result = run_step(st, left, log, out / "steps.log")
        for kept in aside:  # put back where the step never wrote its new profile (skipped, or cut before it):
            again = kept.with_name(kept.name[:-len(SET_ASIDE)])  # else the next run would find both folders
            if result.status == "skipped" or not again.exists():
                kept.rename(again)
        outcomes.append(result)
        log(f"{st.name}: {result.status} in {result.seconds:.1f} s" + (f" -- {result.detail}" if result.detail else ""))
        record["steps"] = [asdict(o) for o in outcomes]
        env_file.write_text(json.dumps(record, indent=1, default=str))
        if st.name == "build" and result.status != "ok":
            log("not every model was built: the steps of those that were go on")
        if st.name == "build" and s.earlier is not None:
            record["rebuilt_models"] = adopt_rebuilt_models(s.work / "profiles" / s.gpu, s.work / "models")
            log(f"{len(record['rebuilt_models'])} earlier profiles now name this build of their model (same code "
                f"and seed; environment.json keeps both sha256s)")
        for group in groups_of([st.name, *(name for name, _ in st.parts)]) if result.status != "skipped" else []:
            packed = pack(s.work / "profiles" / s.gpu, out, group)
            if packed is not None and packed.stat().st_size > MAX_FILE_BYTES:
                log(f"{packed.name} is {packed.stat().st_size / 2**20:.1f} MiB: over the limit, it will not come back")
    record["elapsed_s"] = round(time.monotonic() - started, 1)
    env_file.write_text(json.dumps(record, indent=1, default=str))
    files = sorted(out.iterdir())
    ok = sum(o.status == "ok" for o in outcomes)
    log(f"done: {ok}/{len(outcomes)} steps ok in {record['elapsed_s']:.0f} s; {len(files)} files in {out}: "
        + ", ".join(f"{f.name} ({f.stat().st_size / 2**20:.2f} MiB)" for f in files))
    return 0 if ok == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
