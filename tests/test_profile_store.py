import fcntl
import json
import os
import stat
import subprocess
import sys

import pandas as pd
import pytest

from tbs.errors import ProfileError
from tbs.measure import neighbours
from tbs.profiles import store as store_module
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



def test_a_resume_keeps_the_oldest_reading_of_the_kernels_it_holds(tmp_path):
    # Kernels recorded by an older tbs (no kernel_rules: a BatchNorm folded into its convolution) stay marked so
    # when a newer tbs finishes the profile; a profile with no kernels yet takes the new reading.
    analysis = [{"target": "model", "layer": MODEL_LAYER, "device": "cpu:0", "batch_size": 8, "mode": "inference",
                 "phase": "forward", "kernels": '[{"kind": "memory", "bytes": 8.0, "epilogue": true}]'}]
    for cells, expected in (([analysis], 1), ([], 2)):
        directory = tmp_path / str(expected)
        store = ProfileStore(directory)
        store.create({"model": {"sha256": "abc"}})
        for rows in cells:
            store.add_cell(cell_key("model", MODEL_LAYER, "cpu:0", 8, "inference"), _row(MODEL_LAYER),
                           _samples("model", MODEL_LAYER), rows)
        store.update_metadata(status="interrupted")
        ProfileStore(directory).resume({"model": {"sha256": "abc"}, "kernel_rules": 2})
        assert load_profile(directory).meta.kernel_rules == expected

def test_resume_refuses_another_model(tmp_path):
    store = ProfileStore(tmp_path / "p")
    store.create({"model": {"sha256": "abc"}})
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


def test_a_directory_is_measured_by_one_store_at_a_time(tmp_path):
    first, second = ProfileStore(tmp_path / "p"), ProfileStore(tmp_path / "p")
    first.lock()
    with pytest.raises(ProfileError, match=f"is being measured by tbs process {os.getpid()}"):
        second.lock()
    first.unlock()
    second.lock()
    second.unlock()


def test_without_flock_directories_go_unlocked(tmp_path, monkeypatch):
    """Windows has no fcntl: the store still writes its .lock file, and locks nothing."""
    monkeypatch.setattr(store_module, "_fcntl", None)
    first, second = ProfileStore(tmp_path / "p"), ProfileStore(tmp_path / "p")
    first.lock()
    second.lock()
    assert (tmp_path / "p" / ".lock").is_file()
    first.unlock()
    second.unlock()


def _claim_file(registry, pid, text="process %d measuring x"):
    path = registry / f"{pid}.run"
    path.write_text(text % pid)
    return path


def test_registry_is_shared_by_every_user_and_readable_by_them(tmp_path):
    registry = tmp_path / "reg"
    old = os.umask(0o077)  # a private umask must not hide this run from other users
    try:
        registration = neighbours.Registration("profiles/x", registry)
    finally:
        os.umask(old)
    assert stat.S_IMODE(registry.stat().st_mode) == 0o1777
    assert stat.S_IMODE(registration.path.stat().st_mode) == 0o644
    assert registration.path.read_text() == f"process {os.getpid()} measuring profiles/x"
    assert neighbours.others(registry) == []  # our own run is not a neighbour
    registration.close()
    assert not registration.path.exists()


def test_live_runs_are_reported_and_ended_ones_cleared(tmp_path):
    registry = tmp_path / "reg"
    registry.mkdir()
    live, ended = _claim_file(registry, 999_991), _claim_file(registry, 999_992)
    with open(live) as holder:  # another open file: its lock stands for a live process
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert neighbours.others(registry) == ["process 999991 measuring x"]
    assert live.exists() and not ended.exists()


def test_another_users_unreadable_registration_counts_as_live(tmp_path, monkeypatch):
    """We cannot test its lock, so the warning errs on the side of a live run; our own is not counted."""
    registry = tmp_path / "reg"
    registry.mkdir()
    claim = _claim_file(registry, 999_993)
    real_open, owner = os.open, claim.stat().st_uid

    def refused(path, flags, *args):
        if str(path).endswith(".run"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(neighbours.os, "open", refused)
    assert neighbours.others(registry) == []  # ours, yet unreadable: not another run
    monkeypatch.setattr(neighbours.os, "getuid", lambda: owner + 1)  # now it is another user's
    assert neighbours.others(registry) == ["process 999993 of another user"]
    assert claim.exists()


def test_without_flock_nothing_registers_and_no_run_is_reported(tmp_path, monkeypatch):
    registry = tmp_path / "reg"
    registry.mkdir()
    _claim_file(registry, 999_995)
    monkeypatch.setattr(neighbours, "_fcntl", None)
    registration = neighbours.Registration("profiles/x", registry)
    assert registration.handle is None and not registration.path.exists()
    assert neighbours.others(registry) == []


def test_tbs_imports_where_there_is_no_fcntl():
    """Windows has no fcntl: importing tbs must not fail for want of it."""
    code = ("import sys; sys.modules['fcntl'] = None; import tbs, tbs.profiles.store as s, tbs.measure.neighbours as n; "
            "assert s._fcntl is None and n._fcntl is None and n.others() == []")
    subprocess.run([sys.executable, "-c", code], check=True)
