"""What the GPU run hands back besides its log: the environment it ran in, and its profiles packed; and what
it reads of an earlier run's profiles (--resume-from): their failed cells, and the model builds they name.

The packed files: one tar.gz per group of models, re-written after each step of the group so that a
run stopped from outside still leaves what it measured; with run.log, steps.log and environment.json
that is 7 files, under the 8 a device call brings back.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Any

EXAMPLES = ("cnn_flowers", "rnn_mnist", "rnn_sa", "nn_twins", "lstm_sunspots")
MAX_FILES = 8  # the device tool brings back at most 8 files of 16 MiB
MAX_FILE_BYTES = 15 * 1024 * 1024  # a MiB of margin under 16


def environment_record(dry_run: bool, gpu: str, gpu_name: str, prices: dict[str, float]) -> dict[str, Any]:
    """What ran: the GPU (nvidia-smi), driver and CUDA, the Python packages, the host."""
    def command(*argv: str) -> str | None:
        if shutil.which(argv[0]) is None:
            return None
        done = subprocess.run(list(argv), capture_output=True, text=True)
        return (done.stdout or done.stderr).strip()

    packages = {}
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "keras", "numpy",
                 "pandas", "scipy", "optree", "plotly", "ml-dtypes", "tensorflow"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "dry_run": dry_run, "gpu": gpu, "gpu_name": gpu_name, "python": platform.python_version(),
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "packages": packages, "prices_usd_per_hour": prices,
        "nvidia_smi_query": command("nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                                    "clocks.max.memory,power.limit,pci.bus_id", "--format=csv"),
        "nvidia_smi": command("nvidia-smi"), "lscpu": command("lscpu"),
    }


GROUPS = {"examples": EXAMPLES, "resnet50": ("resnet50",), "efficientnetb0": ("efficientnetb0",),
          "bert_base": ("bert_base",)}


def groups_of(profile_names: list[str]) -> list[str]:
    """The packed files profiles (named model/mode) go into."""
    models = {name.split("/")[0] for name in profile_names}
    return [g for g, members in GROUPS.items() if models & set(members)]


def pack(profiles: Path, out: Path, group: str) -> Path | None:
    """OUT/profiles-<group>.tar.gz of the group's profile folders (paths <gpu>/<model>/<mode>/...)."""
    folders = [profiles / m for m in GROUPS[group] if (profiles / m).is_dir()]
    if not folders:
        return None
    target = out / f"profiles-{group}.tar.gz"
    tmp = target.with_suffix(".tmp")
    _tar(tmp, folders, profiles.parent)
    tmp.replace(target)
    return target


def _tar(target: Path, folders: list[Path], base: Path) -> None:
    """tar.gz of the folders, paths from ``base`` (so they unpack as <gpu>/<model>/<mode>/...)."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = Path(info.name).name
        return None if name in ("report.html", ".reserve", ".lock") else info

    with tarfile.open(target, "w:gz") as tar:
        for folder in folders:
            tar.add(folder, arcname=str(folder.relative_to(base)), filter=keep)


def failed_cells(profile: Path) -> int:
    """Cells recorded as failed (an error or out of memory): the host CPU's LSTMs on the first H200 run, say."""
    rows = [profile / "summary.csv", profile / "model.csv"]
    return sum(r.get("status") in ("error", "oom") for f in rows if f.is_file() for r in csv.DictReader(open(f)))


SET_ASIDE = ".before-harness-fix"  # where a profile measured again keeps its earlier rows (<model>/<mode>.before-...)


def loop_deleted(profile: Path) -> bool:
    """Whether a GPU cell of this profile was timed before the harness loop was kept (the first two H200 runs): its
    timing loop read 0 s an iteration, so it still carries the loop's ~22 us a call (read per cell: a resumed
    profile can hold cells of both harnesses). tbs.predictions.reference.measured.stale_batches reads the same
    with pandas; the driver imports nothing of tbs, so that it runs where tbs would not import."""
    samples = profile / "samples.csv"
    per_cell: dict[tuple[str, str], list[float]] = {}
    for row in csv.DictReader(open(samples)) if samples.is_file() else []:
        if row.get("device", "").startswith("gpu"):
            cell = (row.get("layer", ""), row["batch_size"])
            per_cell.setdefault(cell, []).append(float(row.get("harness_iteration_s") or 0.0))
    return any(statistics.median(values) <= 0.0 for values in per_cell.values())


def set_aside(profile: Path) -> Path:
    """Move a profile to be measured again beside it (<mode>.before-harness-fix): its rows are kept, never deleted."""
    kept = profile.with_name(profile.name + SET_ASIDE)
    if kept.exists():
        raise FileExistsError(f"{kept} already holds an earlier profile; move it before measuring {profile} again")
    return profile.rename(kept)


def adopt_rebuilt_models(profiles: Path, models: Path) -> list[dict[str, str]]:
    """Point each earlier profile at this run's build of its model, so ``tbs profile --resume`` takes it.

    The models are rebuilt from code with seed 0: the same configuration and weights every time (checked), but
    the pickle holds Keras's save time, so its sha256, which --resume compares, differs between builds. Returns
    each profile adopted with both sha256s (environment.json keeps them: --resume rewrites the profile's own)."""
    adopted = []
    for meta_file in sorted(profiles.glob("*/*/metadata.json")):
        model = models / f"{meta_file.parent.parent.name}.pkl"
        meta = json.loads(meta_file.read_text())
        if not model.is_file() or not isinstance(meta.get("model"), dict):
            continue
        digest = hashlib.sha256(model.read_bytes()).hexdigest()
        if meta["model"].get("sha256") not in (None, digest):
            adopted.append({"profile": f"{meta_file.parent.parent.name}/{meta_file.parent.name}",
                            "measured_with_sha256": meta["model"]["sha256"], "rebuilt_sha256": digest})
            meta["model"]["sha256"] = digest
            meta_file.write_text(json.dumps(meta, indent=1))
    return adopted
