"""What the worker's malloc tuning (torchjob.launch.malloc) buys a step: the goodput
workload's step (256 MiB of Linear layers and Adam by default) in a fresh process with
TORCHJOB_MALLOC_TUNING on and off, the two sides taking turns, each repeated; the first
``--skip`` steps of each run are its warm-up and not counted.

    python bench/malloc_tuning.py [--state-mib 256] [--steps 60] [--repeats 5]
                                  [--python PYTHON] [--repo REPO]

``--python`` runs the sides under another interpreter (a command, split like a shell's) and
``--repo`` says where that interpreter sees this repository: the runtime image's Debian torch
and glibc, for example, from a mounted image root (bench/README.md, "Memory allocator")."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import spread

REPO = Path(__file__).resolve().parents[1]


def side(python: list[str], repo: str, tuned: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([f"{repo}/runtime", f"{repo}/bench"]),
        "TORCHJOB_MALLOC_TUNING": "1" if tuned else "0",
    }
    out = subprocess.run(
        [*python, f"{repo}/bench/_malloc_step.py", str(args.state_mib), str(args.steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    run: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return run


def summary(runs: list[dict[str, Any]], skip: int) -> dict[str, list[float]]:
    """Per run: the median step (ms) and faults of its counted steps, and its peak RSS."""
    return {
        "ms": [statistics.median(r["seconds"][skip:]) * 1e3 for r in runs],
        "faults": [statistics.median(r["faults"][skip:]) for r in runs],
        "rss": [r["maxrss_mib"] for r in runs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--state-mib", type=int, default=256)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip", type=int, default=10, help="steps of warm-up per run, not counted")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--repo", default=str(REPO))
    args = p.parse_args()
    if args.steps <= args.skip:
        p.error("--steps must be larger than --skip")
    python = shlex.split(args.python)
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for i in range(args.repeats):
        for tuned in (False, True) if i % 2 == 0 else (True, False):  # ABBA: drift cancels
            runs[tuned].append(side(python, args.repo, tuned, args))
    first = runs[True][0]
    print(
        f"torch {first['torch']}, {args.state_mib} MiB of state, one thread, "
        f"{args.repeats} runs a side of {args.steps} steps ({args.skip} not counted); "
        f"tuned side: {first['why']}"
    )
    default, tuned = summary(runs[False], args.skip), summary(runs[True], args.skip)
    print("| side | step, ms | minor faults a step | peak RSS, MiB |")
    print("|---|---|---|---|")
    for name, s in (("glibc's defaults", default), ("tuned", tuned)):
        print(
            f"| {name} | {spread(s['ms'], '{:.1f}')} | {spread(s['faults'], '{:.0f}')} | "
            f"{spread(s['rss'], '{:.0f}')} |"
        )
    ratios = [d / t for d, t in zip(default["ms"], tuned["ms"], strict=True)]
    print(f"defaults / tuned, step time, run by run: {spread(ratios, '{:.2f}')}")


if __name__ == "__main__":
    main()
