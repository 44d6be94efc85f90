"""Merging profiles of one model from several machines or backends, on hand-built profiles (no measuring)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_report_views import make_profile
from tbs.errors import ProfileError
from tbs.profiles.merge import machine_names, merge_profiles
from tbs.profiles.profile import Profile
from tbs.report import html
from tbs.schema import DEFAULT_BACKEND, ProfileStatus


def _profile(directory: str, host: str = "box", backend: str | None = "tensorflow",
             input_source: str | None = "synthetic (seed 0)", status: str = "complete", cpu: str | None = None) -> Profile:
    """The three-device toy profile, as measured in ``directory`` on ``host`` (with ``cpu``) with ``backend``."""
    profile = make_profile()
    extra = {"host": {"hostname": host, **({"cpu_model": cpu} if cpu else {})}, "status": status}
    if backend is not None:
        extra["backend"] = backend
    if input_source is not None:
        extra["input_source"] = input_source
    return Profile(directory=Path(directory), metadata=dict(profile.metadata, **extra), summary=profile.summary,
                   model=profile.model, samples=profile.samples)


def _refusal(*profiles: Profile) -> str:
    with pytest.raises(ProfileError) as info:
        merge_profiles(list(profiles))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_same_directory_twice_is_refused_naming_it_and_the_device():
    message = _refusal(_profile("runs/a"), _profile("runs/a"))
    assert message.startswith("'runs/a' and 'runs/a' both measured cpu:0 on host box with tensorflow")


def test_two_profiles_of_one_device_on_one_host_are_refused():
    """A profile without a backend ran on the default one, so it collides with an explicit one."""
    assert DEFAULT_BACKEND == "tensorflow"
    message = _refusal(_profile("runs/a", backend=None), _profile("runs/b", host="gpubox"), _profile("runs/c"))
    assert "'runs/a' and 'runs/c'" in message and "cpu:0" in message and "host box" in message


def test_other_hosts_and_backends_keep_their_devices_apart():
    by_host = merge_profiles([_profile("runs/a"), _profile("runs/b", host="gpubox")])
    assert {"box/cpu:0", "gpubox/cpu:0"} <= set(by_host.summary["device"])
    by_backend = merge_profiles([_profile("runs/a"), _profile("runs/b", backend="jax")])
    assert {"cpu:0 (tf)", "cpu:0 (jax)"} <= set(by_backend.summary["device"])
    assert [d["host"] for d in by_backend.metadata["devices"]] == ["box"] * 6


def test_machines_that_share_a_hostname_keep_their_devices_apart():
    """The H200 machine and this one are both called 'vm': by the hostname alone, merging their profiles was refused
    as one device measured twice."""
    merged = merge_profiles([_profile("runs/gpu", host="vm", cpu="Intel(R) Xeon(R) Processor"),
                             _profile("runs/here", host="vm", cpu="AMD EPYC")])
    assert {"vm/cpu:0", "vm-2/cpu:0"} <= set(merged.summary["device"])
    assert [d["host"] for d in merged.metadata["devices"]] == ["vm"] * 3 + ["vm-2"] * 3
    assert machine_names([_profile("runs/old", host="vm"), _profile("runs/new", host="vm", cpu="AMD EPYC")]) == [
        "vm", "vm-2"] and machine_names([_profile("a", host="vm", cpu="AMD EPYC"), _profile("b", host="vm")]) == [
        "vm", "vm"]  # a profile that records only its hostname is that hostname's first machine
    assert "host vm " in _refusal(_profile("runs/a", host="vm", cpu="AMD EPYC"), _profile("runs/b", host="vm", cpu="AMD EPYC"))


def test_user_data_and_synthetic_inputs_are_refused_naming_input_source():
    message = _refusal(_profile("runs/a"), _profile("runs/b", host="gpubox", input_source="/data/reviews.npy"))
    assert "input_source '/data/reviews.npy'" in message and "'synthetic (seed 0)'" in message
    assert message.startswith("'runs/b' was measured on user data")


def test_other_seeds_and_other_data_paths_merge():
    seeds = merge_profiles([_profile("runs/a"), _profile("runs/b", host="gpubox", input_source="synthetic (seed 7)")])
    paths = merge_profiles([_profile("runs/a", input_source="/home/me/x.npy"),
                            _profile("runs/b", host="gpubox", input_source="/srv/x.npy")])
    unrecorded = merge_profiles([_profile("runs/a", input_source=None), _profile("runs/b", host="gpubox")])
    assert all(len(p.metadata["merged_from"]) == 2 for p in (seeds, paths, unrecorded))


def test_merged_status_is_the_first_unfinished_one_and_the_report_says_so():
    merged = merge_profiles([_profile("runs/a"), _profile("runs/b", host="b", status="interrupted"),
                             _profile("runs/c", host="c", status="running")])
    assert merged.metadata["status"] == ProfileStatus.INTERRUPTED and not merged.complete
    assert "<b>This profile is interrupted</b>" in html.section_not_measured(html.ReportData(merged))
    finished = merge_profiles([_profile("runs/a"), _profile("runs/b", host="b")])
    assert finished.metadata["status"] == "complete" and finished.complete
    assert "This profile is" not in html.section_not_measured(html.ReportData(finished))


def test_calibrations_and_analysis_follow_their_devices_into_a_merged_profile():
    a, b = _profile("runs/a", host="box"), _profile("runs/b", host="gpubox")
    for p, rate in ((a, 1e11), (b, 5e13)):
        p.metadata["calibration"] = {"cpu:0": {"matmul_flops_per_s": {"float32": rate}, "memory_bytes_per_s": 1e10}}
        p.analysis = p.summary[["layer", "device", "batch_size", "mode"]].assign(target="layer", phase="forward",
                                                                                  flops=1.0)
    merged = merge_profiles([a, b])
    assert merged.metadata["calibration"]["gpubox/cpu:0"]["matmul_flops_per_s"]["float32"] == 5e13
    assert {"box/cpu:0", "gpubox/cpu:0"} <= set(merged.analysis["device"]) and "cpu:0" not in set(merged.analysis["device"])
