"""The run's `tbs recommend --verify` step, kept as JSON: the placement, its prediction and the measured replay.

    python benchmarks/gpu/verify.py PROFILE_DIR BATCH

Recommends the cheapest placement (the profile's catalog prices) at BATCH, or the fastest where the
cheapest keeps to one device; runs it and every single device for real (tbs.verify), prints the text
the CLI prints and writes PROFILE_DIR/../verify.json (``tbs.render(..., "json")`` of the verified
recommendation: predicted and measured side by side).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tbs  # noqa: E402
from tbs.report.console import verification_text  # noqa: E402


def choose(profile: tbs.Profile, batch: int) -> tbs.Recommendation:
    """The cheapest placement, or the fastest where the cheapest keeps to one device: the point of this
    step is a placement across the CPU and the GPU, run for real (a single device is verified if both are)."""
    recs = [tbs.recommend(profile, objective=objective, batch_size=batch) for objective in ("cost", "time")]
    mixed = [r for r in recs if len(set(r.chosen.placement.values())) > 1]
    chosen = (mixed or recs)[0]
    devices = sorted(set(chosen.chosen.placement.values()))
    print(f"verifying the {chosen.objective} objective's placement: "
          + (f"across {', '.join(devices)}" if mixed else "one device (neither objective splits the model)"), flush=True)
    return chosen


def main(directory: str, batch: str) -> int:
    profile = tbs.load(directory)
    rec = choose(profile, int(batch))
    print(tbs.render(None, "text", recommendation=rec), flush=True)
    tbs.verify(profile, rec)
    print(verification_text(rec.verification), flush=True)
    target = Path(directory).parent / "verify.json"
    target.write_text(tbs.render(None, "json", recommendation=rec))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
