"""Every public call refuses every wrongly typed argument with one TbsError line naming it.

The table below lists, for each public call, every one of its parameters with values of the
wrong type; ``test_the_table_covers_every_parameter`` fails when a call gains a parameter the
table does not test. Each bad call must fail at its argument check, before anything slow: the
error names the parameter, so a check that is missing cannot pass by failing somewhere else.
"""

from __future__ import annotations

import inspect

import pytest

import tbs


@pytest.fixture(scope="module")
def saved(two_device_profile):
    """A finished profile on two fake devices, and a recommendation for it."""
    return two_device_profile, tbs.recommend(two_device_profile, "time")


NOT_A_PATH = object()
# call -> parameter -> wrong values (each must be refused with the parameter's name in the message)
TABLE: dict[str, dict[str, list]] = {
    "profile": {
        "model": [5, None, 2.5], "batch_sizes": [None, "32", [1.5], [0], {"a": 1}], "devices": [5, [5], {"cpu"}],
        "prices": [5, ["cpu"]], "training": ["yes", None, 1, {"loss": "mse"}], "dataset_size": ["x", 0, 2.5],
        "backend": [5, ["jax"]], "input": [5, NOT_A_PATH], "custom_objects": [5, [5]], "safe_mode": ["no", None],
        "out": [5, ["p"]], "resume": ["yes", 1], "measure": [{"xla": True}, 5, tbs.TimingConfig()],
        "timing": [{"min_samples": 3}, 5, tbs.MeasureConfig()], "progress": [5, "loud"], "report": ["x", None],
        "cluster": [5, ["auto"]],
    },
    "load": {"directories": [5, None, ["p"]], "prices": [5, ["cpu"]], "spot": [5, ["tpu"]], "price_file": [5, ["f"]]},
    "recommend": {
        "profile": [5, None], "objective": [5, None], "batch_size": ["x", 1.5], "billing": [5, None],
        "max_latency_ms": ["x", -1], "budget_usd_per_1m": ["x", 0], "prices": [5], "spot": [5], "verify": ["x"],
        "custom_objects": [5], "safe_mode": ["x"], "model": [5, 2.5], "input": [5, NOT_A_PATH],
        "include_predicted": ["x", None],
    },
    "verify": {"profile": [5, None], "recommendation": [5, None, "rec"], "custom_objects": [5], "safe_mode": ["x"],
               "model": [5], "input": [5, NOT_A_PATH]},
    "render": {"profile": [42, 2.5], "fmt": [5, None], "recommendation": [5], "dataset_size": ["x", 0],
               "other_mode": [5], "other_mode_recommendation": [5], "compare": [5], "compare_recommendation": [5],
               "top": ["x", 0, True, 2.5],
               "group": [5, "layers"]},
    "devices": {"backend": [5, [5], ""]},
    "predict": {"profile": [5], "devices": [5, None, [5], ""], "source": [5, ["cpu:0"]], "catalog": [5, ["c.csv"]],
                "prices": [5]},
    "diff": {"base": [5, None], "new": [5, None], "threshold": ["x", -0.1, True, None], "confidence": ["x", 1.5, 0.2, True],
             "force": ["yes", None, 1], "gate": [5, "layers", None], "prices": [5, ["cpu"]], "spot": [5, ["tpu"]]},
    "cluster_groups": {"address": [5, None, ""]},
    "Profile.save": {"directory": [5, None]},
    "TimingConfig": {name: ["x", None] for name in inspect.signature(tbs.TimingConfig).parameters},
    "MeasureConfig": {name: ["x", None, 1.5] for name in inspect.signature(tbs.MeasureConfig).parameters},
    "TrainingConfig": {"loss": [5, ["mse"], " "], "optimizer": [5, {}, ""]},
}


def _call(name: str, parameter: str, value, saved) -> None:
    """The call with good arguments everywhere but ``parameter``."""
    directory, rec = saved
    if name == "profile":
        kwargs = {parameter: value} if parameter != "model" else {}
        return tbs.profile(value if parameter == "model" else "missing.pkl", **kwargs)
    if name == "load":
        return tbs.load(value) if parameter == "directories" else tbs.load(directory, **{parameter: value})
    if name in ("recommend", "verify", "predict"):
        first = {"recommend": ("profile", directory), "verify": ("profile", directory),
                 "predict": ("profile", directory)}[name]
        args = {first[0]: first[1]}
        if name == "verify":
            args["recommendation"] = rec
        if name == "predict":
            args["devices"] = "l4"
        if name == "recommend":
            args["objective"] = "time"
        args[parameter] = value
        return getattr(tbs, name)(**args)
    if name == "render":
        return tbs.render(**{"profile": directory, parameter: value})
    if name == "diff":
        return tbs.diff(**{"base": directory, "new": directory, parameter: value})
    if name == "devices":
        return tbs.devices(value)
    if name == "cluster_groups":
        return tbs.cluster_groups(value)
    if name == "Profile.save":
        return tbs.load(directory).save(value)
    return getattr(tbs, name)(**{parameter: value})  # the settings dataclasses


def _parameters(name: str) -> set[str]:
    target = tbs.Profile.save if name == "Profile.save" else getattr(tbs, name)
    return {p for p in inspect.signature(target).parameters if p != "self"}


@pytest.mark.parametrize("name", list(TABLE))
def test_the_table_covers_every_parameter(name):
    assert set(TABLE[name]) == _parameters(name)


@pytest.mark.parametrize("name, parameter, value", [
    (name, parameter, value) for name, parameters in TABLE.items()
    for parameter, values in parameters.items() for value in values])
def test_a_wrongly_typed_argument_is_one_tbs_error_naming_it(name, parameter, value, saved):
    with pytest.raises(tbs.TbsError) as caught:
        _call(name, parameter, value, saved)
    message = str(caught.value)
    assert "\n" not in message
    named = {"directories": "directories", "devices": "devices", "model": "model", "fmt": "fmt"}.get(parameter, parameter)
    assert named in message, message
