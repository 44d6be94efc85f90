"""Each measured device's real ceilings: achievable FLOP/s per dtype and memory bandwidth.

A datasheet peak is not what a device delivers to a compiled program here (clock limits,
threads, a shared machine). A short calibration per device -- a large matmul per dtype the
model computes in, and a large streaming read -- timed with the same harness as every cell,
gives the ceilings a roofline needs. Saved in the profile's metadata (``calibration``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from tbs.backends.base import Device
from tbs.measure import rows
from tbs.measure.timing import Interleaved, Interrupted, Measurement, Runner, Timer

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
# Results per (backend, device) in this process: a ceiling does not change between runs of one process.
_CACHE: dict[tuple[str, str, str], dict[str, Any]] = {}


def model_dtypes(calls: Iterable[Any]) -> list[str]:
    """The floating dtypes the model's layers compute in (float32 always: the catalog's default)."""
    found = ["float32"]
    for call in calls:
        policy = getattr(getattr(call, "op", None), "dtype_policy", None)
        dtype = str(getattr(policy, "compute_dtype", "") or "")
        if dtype in SUPPORTED_DTYPES and dtype not in found:
            found.append(dtype)
    return found


def calibrate(device: Device, dtypes: list[str], timer: Timer, harness: Runner) -> dict[str, Any]:
    """Time a matmul per dtype and a streaming read on ``device``; return its ceilings.

    A program that fails (a dtype the device lacks, memory) leaves its figure out and says why.
    """
    result: dict[str, Any] = {"matmul_flops_per_s": {}, "memory_bytes_per_s": None, "programs": [], "failed": {}}
    for dtype in dtypes:
        key = (device.backend, device.name, dtype)
        if key not in _CACHE:
            _CACHE[key] = _calibrate_dtype(device, dtype, timer, harness, with_stream=dtype == dtypes[0])
        found = _CACHE[key]
        result["programs"].extend(found["programs"])
        result["failed"].update(found["failed"])
        if "matmul" in found:
            result["matmul_flops_per_s"][dtype] = found["matmul"]
        if "stream" in found:
            result["memory_bytes_per_s"] = found["stream"]
    return result


def _calibrate_dtype(device: Device, dtype: str, timer: Timer, harness: Runner, with_stream: bool) -> dict[str, Any]:
    """The dtype's programs sampled together in rounds (as cells are): they share one minimum span."""
    found: dict[str, Any] = {"programs": [], "failed": {}}
    try:
        programs = device.calibration_programs(dtype)
    except Exception as exc:  # a dtype this device cannot compute in: no ceiling for it
        found["failed"][dtype] = rows.reason(exc)
        return found

    def failed(name: str, exc: BaseException) -> None:  # out of memory, a dtype the device lacks: why, and go on
        found["failed"][f"{name} {dtype}"] = rows.reason(exc)

    sampler = Interleaved(timer, harness)
    for program in programs:
        if program.name == "stream" and not with_stream:
            continue
        try:
            sampler.add(program.name, program.runner)
        except Interrupted:
            raise
        except Exception as exc:
            failed(program.name, exc)
    measured: dict[str, Measurement] = {}
    sampler.run(on_done=measured.__setitem__, on_error=failed)
    for program in (p for p in programs if p.name in measured):
        seconds = measured[program.name].summary(timer.config.confidence).median_s
        if not seconds or seconds <= 0:
            found["failed"][f"{program.name} {dtype}"] = "timed as zero (below the harness's resolution)"
            continue
        rate = (program.flops if program.name == "matmul" else program.bytes) / seconds
        found[program.name] = rate
        found["programs"].append({"name": program.name, "dtype": dtype, "seconds": seconds,
                                  "flops": program.flops, "bytes": program.bytes})
    return found


def calibrate_devices(devices: list[Device], dtypes: list[str], timer: Timer, harness_for: Callable[[Device], Runner],
                      done: dict[str, Any], describe: Callable[[str], None]) -> dict[str, Any]:
    """Every device's ceilings not yet in ``done`` (a resumed profile keeps its calibration)."""
    out = dict(done)
    for device in devices:
        if device.name in out:
            continue
        describe(f"calibrating {device.name}: a large matmul ({', '.join(dtypes)}) and a streaming read")
        out[device.name] = calibrate(device, dtypes, timer, harness_for(device))
    return out
