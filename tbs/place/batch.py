"""Which batch size ``recommend`` places when none is given: the largest one with a time for every layer."""

from __future__ import annotations

import pandas as pd

from tbs.schema import MEASURED


def usable(rows: pd.DataFrame) -> pd.Series:
    """Rows with a time that ran where they say (measured ok/noisy, or a prediction with a number)."""
    return rows["status"].isin(MEASURED) & pd.to_numeric(rows["median_s"], errors="coerce").notna()


def choose_batch(summary: pd.DataFrame, layers: list[str]) -> tuple[int, str]:
    """The largest batch at which every layer has a time on some device, and what was passed over (a note).

    The largest profiled batch is often the one that ran out of memory; placing it would fail
    on layers that have no time there, though a smaller batch has every number.
    """
    batches = sorted({int(b) for b in summary["batch_size"]}, reverse=True)
    timed = summary[usable(summary)]
    passed: list[str] = []
    for batch in batches:
        here = summary[summary["batch_size"] == batch]
        missing = set(layers) - set(timed.loc[timed["batch_size"] == batch, "layer"])
        if not missing:
            note = "" if not passed else (f"batch {batch}: the largest batch with a time for every layer "
                                          f"({'; '.join(passed)}); pick another with --batch")
            return batch, note
        statuses = here.loc[here["layer"].isin(missing) & ~usable(here), "status"].astype(str).value_counts()
        why = ", ".join(statuses.index) or "not measured"
        passed.append(f"batch {batch} has no time for {len(missing)} of {len(layers)} layers: {why}")
    return batches[0], ""  # no batch has every layer: check_placeable names the layer that has none
