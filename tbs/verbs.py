"""The API's verbs after ``profile`` and ``load``: diff, predict, recommend, verify, render, and the devices here.

Each takes a Profile or a profile directory, checks its arguments first (``tbs.checks``) and
calls the stage that does the work; nothing here measures, except ``verify``, which replays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import pandas as pd

from tbs import backends, checks
from tbs.backends.base import Device
from tbs.compare import Diff
from tbs.cost.reprice import reprice
from tbs.errors import TbsError
from tbs.loading import PathLike, as_profile
from tbs.place.result import Recommendation
from tbs.place.verify import Verification, verify_recommendation
from tbs.profiles.profile import Profile
from tbs.report.base import render as _render
from tbs.report.groups import DEFAULT_TOP
from tbs.run import custom_object_dict


def diff(base: Profile | PathLike, new: Profile | PathLike, *, threshold: float = 0.10, confidence: float = 0.95,
         force: bool = False, gate: str = "all", prices: str | Mapping[str, float] | None = None,
         spot: str | Mapping[str, float] | None = None) -> Diff:
    """``new`` against ``base``: per layer, device and batch, and whole, the change beyond noise (a ``tbs.Diff``).

    ``threshold`` (a fraction: 0.10 is 10%) and ``gate`` ('all' cells or only the whole 'model') decide
    ``Diff.regressed``: a cell slower beyond noise by more than the threshold, or failing where BASE ran.
    ``confidence`` is the level of every interval and of the verdicts (corrected for the number of cells).
    Profiles measured in another mode, backend or input are refused unless ``force``. ``prices``/``spot``
    re-price both sides alike. Render it with ``tbs.render(d, "text" | "markdown" | "json")``.
    """
    from tbs.compare import GATES
    from tbs.compare import diff as _diff

    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 100:
        raise TbsError(f"threshold={threshold!r}: give a fraction of 0 or more, e.g. 0.10 for 10% (--threshold 10%)")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 <= confidence < 1:
        raise TbsError(f"confidence={confidence!r}: give a level between 0.5 and 1, e.g. 0.95 (--confidence)")
    if gate not in GATES:
        raise TbsError(f"gate={gate!r}: choose {' or '.join(map(repr, GATES))} (--gate)")
    force = checks.flag("force", force)
    new_prices, discounts = checks.prices(prices), checks.spot(spot)
    sides = []
    for name, value in (("base", base), ("new", new)):
        loaded = as_profile(value, name)
        sides.append(reprice(loaded, new_prices, discounts) if new_prices or discounts else loaded)
    return _diff(sides[0], sides[1], threshold=float(threshold), confidence=float(confidence), force=force, gate=gate)


def predict(profile: Profile | PathLike, devices: str | Sequence[str], *, source: str | None = None,
            catalog: PathLike | None = None, prices: str | Mapping[str, float] | None = None) -> Profile:
    """The profile with predicted cells for catalog devices it did not measure (``profile.predictions``).

    A GPU predicted from a CPU profile is priced by the GPU model fitted on published GPU
    measurements, from each layer's FLOPs, bytes and shapes (tbs.predictions.gpu_model); any
    other target scales each layer's measured time on ``source`` (default: a measured device of
    the target's kind, else the CPU) by a roofline against its catalog ceilings. Every row has
    a 90% band and says ``source=predicted`` and its method. ``prices`` override catalog prices by device id (``h100=2.5``). Nothing measured changes.
    """
    from tbs.predictions import predict as _predict

    targets = checks.names("devices", devices, "['l4', 'h100']")
    source = checks.text("source", source, "cpu:0")
    catalog = checks.path("catalog", catalog, "a device catalog CSV")
    result = _predict(as_profile(profile), targets, source, None if catalog is None else str(catalog))
    priced = reprice(result, checks.prices(prices), {})  # the catalog's prices, or those given, to dollars
    # Only the predicted rows are priced here: the measured ones keep their prices (and any spot discount).
    metadata = dict(result.metadata, prices_usd_per_hour=priced.meta.prices_usd_per_hour)
    return dataclasses.replace(result, predictions=priced.predictions, metadata=metadata)


def recommend(profile: Profile | PathLike, objective: str = "cost", *, batch_size: int | None = None,
              billing: str = "metered", max_latency_ms: float | None = None, budget_usd_per_1m: float | None = None,
              prices: str | Mapping[str, float] | None = None, spot: str | Mapping[str, float] | None = None,
              verify: bool = False, custom_objects: Any = None, safe_mode: bool = True, model: Any = None,
              input: Any = None, include_predicted: bool = False) -> Recommendation:
    """Which device each layer should run on, transfers included (exact), against every single device.

    ``prices``/``spot`` re-price the devices they name (the others keep their profiled
    prices). ``verify=True`` runs the placement and the single devices for real on this
    machine (``rec.verification``, see ``verify``): a split wins only when it measures better.
    ``include_predicted=True`` adds the profile's predicted devices (``tbs.predict``) as
    candidates; without it they are left out, and ``rec.predicted_note`` says so either way.
    """
    from tbs.place.predicted import band_dependence, ignored_note, with_predictions
    from tbs.place.recommend import recommend as solve

    if objective not in ("cost", "time"):
        raise TbsError(f"objective={objective!r}: choose 'cost' or 'time' (--objective)")
    if billing not in ("metered", "dedicated"):
        raise TbsError(f"billing={billing!r}: choose 'metered' or 'dedicated' (--billing)")
    batch = None if batch_size is None else checks.whole("batch_size", batch_size, 1, " (--batch)")
    latency = checks.positive("max_latency_ms", max_latency_ms, "--max-latency")
    budget = checks.positive("budget_usd_per_1m", budget_usd_per_1m, "--budget")
    _replay_arguments(custom_objects, safe_mode, model, input)  # checked now, even where verify=False
    new_prices, discounts = checks.prices(prices), checks.spot(spot)
    verify, include_predicted = checks.flag("verify", verify), checks.flag("include_predicted", include_predicted)
    chosen = as_profile(profile)
    if prices is not None or spot is not None:
        chosen = reprice(chosen, new_prices, discounts)
    note = ignored_note(chosen)
    unplaced = chosen
    if include_predicted:
        chosen, note = with_predictions(chosen)
    rec = solve(chosen, objective, batch, billing, latency, budget)
    rec.predicted_note = note
    if include_predicted and note:
        rec.prediction_dependence = band_dependence(
            unplaced, rec.chosen.placement,
        lambda p: solve(p, objective, batch, billing, latency, budget, with_frontier=False).chosen.placement)
    if verify:
        if include_predicted and note:
            raise TbsError("verify: predicted devices cannot be run here; verify without include_predicted")
        _verify(chosen, rec, custom_objects, safe_mode, model, input)
    return rec


def verify(profile: Profile | PathLike, recommendation: Recommendation, *, custom_objects: Any = None,
           safe_mode: bool = True, model: Any = None, input: Any = None) -> Verification:
    """Run a recommended placement and every single device for real, on this machine; predicted vs measured.

    Replays the profiled model file, or ``model`` (an in-memory keras.Model, for a profile
    of one), on the profile's inputs (``input`` arrays when it was measured on arrays), with
    the same devices (``TBS_LOGICAL_CPUS`` as when profiling). Sets and returns
    ``recommendation.verification``.
    """
    return _verify(profile, recommendation, custom_objects, safe_mode, model, input)


def _replay_arguments(custom_objects: Any, safe_mode: Any, model: Any, arrays: Any) -> tuple[Any, bool]:
    """What a replay of the model needs, checked: (custom objects, safe mode)."""
    if model is not None:
        checks.model_or_path(model)
    checks.input_data(arrays)
    return checks.custom_objects(custom_objects), checks.flag("safe_mode", safe_mode)


def _verify(profile: Any, recommendation: Any, custom_objects: Any, safe_mode: Any, model: Any,
            arrays: Any) -> Verification:
    if not isinstance(recommendation, Recommendation):
        raise TbsError(f"recommendation: give the tbs.Recommendation that tbs.recommend returned, "
                       f"not {type(recommendation).__name__}")
    custom_objects, safe_mode = _replay_arguments(custom_objects, safe_mode, model, arrays)
    result = verify_recommendation(as_profile(profile), recommendation, custom_object_dict(custom_objects),
                                   safe_mode, model=model, arrays=arrays)
    recommendation.verification = result
    return result


def placement_for_report(profile: Profile) -> Recommendation | str:
    """The report's placement (cost when priced, else time), or why a report cannot show one."""
    devices = sorted(profile.summary["device"].dropna().unique()) if len(profile.summary) else []
    if len(devices) < 2:
        return "One device profiled: nothing to place. Profile two or more devices."
    programs = {(str((e.get("host") or {}).get("hostname")), e.get("backend") or backends.DEFAULT)
                for e in profile.meta.environments}
    if len(programs) > 1:
        return ("These profiles come from different machines or backends, and a placement splits one model "
                "inside one program on one machine: run tbs recommend on each profile directory. "
                "The sections above compare them layer by layer.")
    priced = len(profile.summary) and profile.summary["usd_per_hour"].notna().any()
    try:
        return recommend(profile, "cost" if priced else "time")
    except TbsError as exc:
        return f"No recommendation: {exc}"


def render(profile: Profile | Diff | PathLike | None, fmt: str = "text", *, recommendation: Recommendation | str | None = None,
           dataset_size: int | None = None, other_mode: Profile | PathLike | None = None,
           other_mode_recommendation: Recommendation | str | None = None, top: int | None = DEFAULT_TOP,
           group: str | None = None, compare: Profile | PathLike | None = None,
           compare_recommendation: Recommendation | str | None = None) -> str:
    """``fmt``: text, html (self-contained), json, csv, predicted or trace (Chrome/Perfetto trace-event JSON: the
    traced whole-model calls op by op under their Keras layers, and the isolated cells). Returns the text;
    nothing is measured or solved.

    ``top``: text and html show that many heaviest layers and fold the rest into one line
    ("N more layers, x% of the time"); None shows every layer. ``group``: 'kind' or 'block',
    the text's totals per layer kind or per block instead of the layers.

    ``dataset_size`` adds the cost of a workload of that many samples (one epoch in training);
    by default the size the profile recorded (``tbs.profile(dataset_size=...)``, ``--dataset-size``).

    ``other_mode`` is a profile of the same model in the other mode (inference against training):
    both are shown, with the layers whose cheapest device differs between them;
    ``other_mode_recommendation`` is its placement. ``compare`` and ``compare_recommendation``
    are their old names, still accepted.

    A ``tbs.Diff`` (``tbs.diff``) renders as text, markdown or json: the cells that changed, or every
    cell with ``top=None``.
    """
    if isinstance(profile, Diff):
        from tbs.report import diff as diff_report

        if fmt not in diff_report.FORMATS:
            raise TbsError(f"fmt={fmt!r}: a tbs.Diff renders as {', '.join(diff_report.FORMATS)}")
        return diff_report.render(profile, fmt, every_cell=top is None)
    if not isinstance(fmt, str):
        raise TbsError(f"fmt={fmt!r}: give a format name: text, html, json, csv, predicted or trace")
    other_mode, other_name = _renamed("other_mode", other_mode, "compare", compare)
    other_rec, rec_name = _renamed("other_mode_recommendation", other_mode_recommendation,
                                   "compare_recommendation", compare_recommendation)
    for name, value in (("recommendation", recommendation), (rec_name, other_rec)):
        if value is not None and not isinstance(value, (Recommendation, str)):
            raise TbsError(f"{name}: give a tbs.Recommendation (from tbs.recommend), not {type(value).__name__}")
    return _render(None if profile is None else as_profile(profile), fmt, recommendation, checks.dataset_size(dataset_size),
                   other_mode=None if other_mode is None else as_profile(other_mode, other_name),
                   other_mode_recommendation=other_rec, top=top, group=group)


def _renamed(name: str, value: Any, old_name: str, old_value: Any) -> tuple[Any, str]:
    """An argument given by its name or its old name (not both), and the name it was given by."""
    if old_value is None:
        return value, name
    if value is not None:
        raise TbsError(f"{old_name}= is the old name of {name}=: give one of them")
    return old_value, old_name


def devices(backend: str | Sequence[str] | None = None) -> pd.DataFrame:
    """One row per device found, and per kind or backend missing with the reason.

    Columns: backend, device, kind, description, memory_bytes, available, reason.
    """
    names = backends.BACKENDS if backend is None else checks.names("backend", backend, "'jax'")
    for name in names:
        backends.check(name)
    backends.prepare_discovery()
    rows: list[dict[str, Any]] = []
    for name in names:
        missing = backends.installed(name)
        try:
            found = None if missing else backends.discover(name)
        except Exception as exc:  # a broken install is a reason, not a crash
            missing = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            found = None
        if found is None:
            rows.append(dict(backend=name, device=None, kind=None, available=False, reason=missing))
            continue
        rows += [_device_row(name, d) for d in found.devices]
        rows += [dict(backend=name, device=None, kind=kind, available=False, reason=reason)
                 for kind, reason in found.missing.items()]
    columns = ["backend", "device", "kind", "description", "memory_bytes", "available", "reason"]
    return pd.DataFrame(rows, columns=columns)


def cluster_groups(address: str) -> list[Any]:
    """A Ray cluster's alive nodes grouped by what they offer (``tbs devices --cluster``); needs tbs[ray]."""
    from tbs.cluster.discovery import connect, node_groups

    return node_groups(connect(checks.text("address", address, "auto", optional=False)))


def _device_row(backend: str, device: Device) -> dict[str, Any]:
    return dict(backend=backend, device=device.name, kind=device.kind, description=device.description,
                memory_bytes=device.memory_bytes, available=True, reason=None)

