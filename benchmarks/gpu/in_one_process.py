"""Several `tbs profile` runs in one process: one JAX, CUDA and Keras start-up instead of one each.

    python benchmarks/gpu/in_one_process.py '[{"name": "rnn_mnist/inference", "args": [...], "budget_s": 30}, ...]'

Each run has its own wall budget: at the budget a timer sends this process Ctrl-C, which tbs answers
as at a terminal (it stops after the current sample, keeps every row it wrote and marks the profile
interrupted), and the next run starts. The driver (drive.py) still kills the whole process if it
outlives the sum of the budgets. One line per run: `== NAME: ok|cut|failed (exit code) in S s`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tbs.cli import cli  # noqa: E402


def run_one(name: str, args: list[str], budget_s: float) -> str:
    """One CLI run within ``budget_s``; its outcome (ok, cut, failed)."""
    timer = threading.Timer(budget_s, os.kill, (os.getpid(), signal.SIGINT))
    started, code = time.monotonic(), 0
    print(f"== {name}: tbs {' '.join(args)}", flush=True)
    timer.start()
    try:
        cli.main(args, prog_name="tbs", standalone_mode=False)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except KeyboardInterrupt:  # Ctrl-C outside tbs's own handler (between its stages)
        code = 130
    except Exception as exc:  # one run's failure is recorded; the next run goes on
        print(f"{type(exc).__name__}: {exc}", flush=True)
        code = 1
    finally:
        timer.cancel()
    status = "ok" if code == 0 else ("cut" if time.monotonic() - started >= budget_s else "failed")
    print(f"== {name}: {status} ({code}) in {time.monotonic() - started:.1f} s", flush=True)
    return status


def main(runs: list[dict]) -> int:
    statuses = [run_one(r["name"], r["args"], float(r["budget_s"])) for r in runs]
    return 0 if all(s == "ok" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
