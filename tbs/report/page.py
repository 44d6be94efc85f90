"""What every HTML section shares: the report's data (derived once per render) and the HTML helpers.

Kept apart from ``html`` (the inference sections and the page) so the training and
comparison sections can use them too; nothing here measures or solves.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import cached_property, lru_cache

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from tbs.place.result import Recommendation
from tbs.profiles.profile import Profile, with_layer_sums
from tbs.report.winners import with_intervals
from tbs.report.vocabulary import inactive_layers, not_in_step
from tbs.report.figures import View
from tbs.report.groups import DEFAULT_TOP, fold, layer_groups, measured_table
from tbs.schema import Status

STATUS_COLORS = {Status.OK.value: "#2e7d32", Status.NOISY.value: "#b26a00", Status.OOM.value: "#c62828",
                 Status.ERROR.value: "#c62828", Status.CPU_FALLBACK.value: "#6a1b9a",
                 Status.UNSUPPORTED.value: "#546e7a"}


@dataclass
class ReportData:
    """What every section reads; each derived frame is computed once per render (sections only read it)."""

    profile: Profile
    dataset_size: int | None = None
    recommendation: Recommendation | str | None = None  # solved by the caller, or why there is none
    top: int | None = DEFAULT_TOP  # the heaviest layers drawn one by one; None: every layer

    @cached_property
    def summary(self) -> pd.DataFrame:
        return with_intervals(self.profile.summary)

    @cached_property
    def model(self) -> pd.DataFrame:
        return with_layer_sums(self.profile.summary, self.profile.model)

    @cached_property
    def layers(self) -> list[str]:
        return self.profile.layer_names

    @cached_property
    def devices(self) -> list[str]:
        return sorted(self.profile.summary["device"].dropna().unique()) if len(self.profile.summary) else []

    @cached_property
    def batches(self) -> list[int]:
        return sorted({int(b) for b in self.profile.summary["batch_size"].dropna()})

    @cached_property
    def priced_devices(self) -> list[str]:
        s = self.profile.summary
        return sorted(s[s["usd_per_hour"].notna()]["device"].unique()) if len(s) else []

    @cached_property
    def training(self) -> bool:
        return self.profile.mode == "training"

    @cached_property
    def groups(self) -> pd.DataFrame:
        """Each layer's kind and block (model order)."""
        return layer_groups(self.profile)

    def heaviest(self, batch: int | None = None) -> list[str]:
        """The ``top`` heaviest layers by time at ``batch`` (None: at any batch), in model order; all when few."""
        if self.top is None or len(self.layers) <= self.top:
            return self.layers
        batches = self.batches if batch is None else [batch]
        tables = [measured_table(self.summary, self.layers, self.devices, b).add_prefix(f"{b}:") for b in batches]
        shown = set(fold(pd.concat(tables, axis=1), self.top).shown) if tables else set()
        return [layer for layer in self.layers if layer in shown]

    @cached_property
    def view(self) -> View:
        return View(self.layers, self.profile.mode, set(inactive_layers(self.profile)), self.devices,
                    set(not_in_step(self.profile)))


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value))



PAGE_LAYOUT = dict(margin=dict(l=60, r=20, t=50, b=60), height=460, legend=dict(orientation="h", y=1.08, x=0))


@lru_cache(maxsize=1)
def _template() -> dict:
    """plotly_white as JSON, made once: setting it on each figure re-validates the whole template (~10 ms)."""
    return go.Figure(layout=dict(template="plotly_white")).to_dict()["layout"]["template"]


def figure(fig: go.Figure) -> str:
    """The page's defaults (template, height, margins, legend on top) where the figure did not set its own.

    The figure was validated as it was built; its JSON gets the defaults merged in and is written
    without a second validation.
    """
    data = fig.to_plotly_json()
    own_layout = {key: value for key, value in data["layout"].items() if key != "template"}
    layout = data["layout"] = {"template": _template(), **own_layout}
    # In the order plotly's update_layout writes new keys (nested objects first), so the page is as it was.
    for key, default in sorted(PAGE_LAYOUT.items(), key=lambda item: not isinstance(item[1], dict)):
        own = layout.get(key)
        if isinstance(own, dict) and isinstance(default, dict):
            layout[key] = {**own, **{k: v for k, v in default.items() if k not in own}}
        else:
            layout[key] = default if own is None else own
    return pio.to_html(data, full_html=False, include_plotlyjs=False, validate=False,
                       config={"displaylogo": False, "responsive": True})


def table(frame: pd.DataFrame, status_column: str | None = None) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in frame.columns)
    rows = []
    for _, row in frame.iterrows():
        cells = []
        for column in frame.columns:
            value = row[column]
            style = ""
            if column == status_column and value in STATUS_COLORS:
                style = f' style="color:{STATUS_COLORS[value]};font-weight:600"'
            cells.append(f"<td{style}>{esc(value)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
