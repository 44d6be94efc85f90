"""The report's size and render time for big models: HTML page bytes, seconds to render, console lines.

    python benchmarks/report_models.py resnet50 bert_encoder
    tbs profile models/resnet50.pkl --batch 1,8 --cost cpu=0.5 --out /tmp/p/resnet50 ...
    python benchmarks/report_size.py /tmp/p/resnet50 /tmp/p/bert_encoder

Renders each saved profile (nothing is measured) with the tbs on PYTHONPATH, so the same
profiles can be rendered by two checkouts and compared (``PYTHONPATH=/other/checkout python
benchmarks/report_size.py ...``). Render times are CPU seconds of this process, the best of
--repeats. Prints one markdown table row per profile.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import tbs  # the tbs on PYTHONPATH: this checkout's, or another's to compare
from tbs.api import placement_for_report


def _best_seconds(call, repeats: int) -> float:
    """The best of ``repeats`` calls in this process's CPU seconds (a shared, loaded machine skews wall time)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
    return best


def measure(directory: Path, repeats: int) -> dict[str, object]:
    """Bytes and best-of-``repeats`` CPU seconds of the HTML page (plotly.js inlined, and without it), console lines."""
    profile = tbs.load(directory)
    rec = placement_for_report(profile)
    page = tbs.render(profile, "html", recommendation=rec)
    plotly_js = re.search(r"<script type='text/javascript'>.*?</script>", page, flags=re.S)
    text = tbs.render(profile, "text")
    devices = profile.summary["device"].nunique()
    batches = profile.summary["batch_size"].nunique()
    return {"profile": profile.meta.model.get("name"), "layers": len(profile.layers), "devices": devices,
            "batches": batches, "page_bytes": len(page.encode()),
            "page_bytes_without_plotly_js": len(page.encode()) - len(plotly_js.group(0).encode()),
            "plotly_figures": page.count("Plotly.newPlot("),
            "html_seconds": _best_seconds(lambda: tbs.render(profile, "html", recommendation=rec), repeats),
            "text_seconds": _best_seconds(lambda: tbs.render(profile, "text"), repeats),
            "console_lines": len(text.splitlines())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"tbs at {Path(tbs.__file__).parent.parent}")
    print("| model | layers | devices × batches | page | page without plotly.js | figures | render HTML (CPU s) | "
          "render text (CPU s) | console lines |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for directory in args.profiles:
        r = measure(directory, args.repeats)
        print(f"| {r['profile']} | {r['layers']} | {r['devices']} × {r['batches']} | {r['page_bytes'] / 1e6:.2f} MB | "
              f"{r['page_bytes_without_plotly_js'] / 1e6:.2f} MB | {r['plotly_figures']} | {r['html_seconds']:.2f} s | "
              f"{r['text_seconds']:.2f} s | {r['console_lines']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
