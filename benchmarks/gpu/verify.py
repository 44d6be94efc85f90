"""The run's `tbs recommend --verify` step, kept as JSON: the placement, its prediction and the measured replay.

    python benchmarks/gpu/verify.py PROFILE_DIR BATCH

Recommends the cheapest placement (the profile's catalog prices) at BATCH, runs it and every single
device for real (tbs.verify), prints the text the CLI prints and writes PROFILE_DIR/../verify.json
(``tbs.render(..., "json")`` of the verified recommendation: predicted and measured side by side).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tbs  # noqa: E402
from tbs.report.console import verification_text  # noqa: E402


def main(directory: str, batch: str) -> int:
    profile = tbs.load(directory)
    rec = tbs.recommend(profile, objective="cost", batch_size=int(batch))
    print(tbs.render(None, "text", recommendation=rec), flush=True)
    tbs.verify(profile, rec)
    print(verification_text(rec.verification), flush=True)
    target = Path(directory).parent / "verify.json"
    target.write_text(tbs.render(None, "json", recommendation=rec))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
