"""The rows of run (e), which was stopped (SIGTERM) before it printed its table, recomputed from
their files with the bench's own accounting (bench/goodput_accounting.py) and readers
(bench/goodput.py). Run from the repository root:

    PYTHONPATH=runtime:operator:. .venv/bin/python bench/results/2026-11-26d/hard/reconstruct.py

The row directories were /tmp/tj-goodput-N-*; their events are copied here, and their
checkpoint directories (the committed progress) were read when this ran. Wall time runs from
a row's first step to its last (the bench's own end is up to a minute later).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, ".")
from bench import goodput_accounting as acc
from bench import goodput_rows as g

ROWS = [
    ("/tmp/tj-goodput-0-reqgndsw", "RecreateGroup", "none"),  # torchjob's baseline
    ("/tmp/tj-goodput-1-5quhw7ob", "Kubeflow", "none"),  # Kubeflow's baseline
    ("/tmp/tj-goodput-2-w06v163v", "Elastic", "hard"),
    ("/tmp/tj-goodput-3-8igfn1kr", "Kubeflow", "hard"),  # cut after 3 of 10 kills
]


def row(d: str, policy: str, mode: str, workers: int = 8) -> dict[str, Any]:
    base = Path(d)
    ev = g.read_events(base / "events.jsonl")
    steps = [e for e in ev if e["ev"] == "step"]
    committed = acc.committed_samples(ev, g.storage_metrics(base / "checkpoints"))
    t0, t1 = steps[0]["t"], steps[-1]["t"]
    gens = sorted({e["gen"] for e in steps})
    lost = []
    for gen in gens[1:]:
        before = max(e["step"] for e in steps if e["gen"] < gen)
        first = min(e["step"] for e in steps if e["gen"] == gen)
        lost.append(max(0, before - (first - 1)))
    at: dict[int, float] = {}
    for a, b in itertools.pairwise(steps):
        at[a.get("world", workers)] = at.get(a.get("world", workers), 0.0) + b["t"] - a["t"]
    return {
        "policy": policy,
        "mode": mode,
        "committed": committed,
        "wall": t1 - t0,
        "gens": len(gens),
        "lost": lost,
        "last": steps[-1]["step"],
        "share": {w: round(s / (t1 - t0), 3) for w, s in sorted(at.items(), reverse=True)},
        "fig": acc.RowFigures(policy, mode, committed, t1 - t0, workers, 0, "ddp"),
    }


def main() -> None:
    rows = [row(*r) for r in ROWS]
    ideal = acc.ideal_rates(r["fig"] for r in rows[:2])
    print("ideal rates:", {k: round(v, 1) for k, v in ideal.items()})
    for r in rows:
        print(
            f"{r['policy']:<14}{r['mode']:<6} committed {r['committed']:>8} "
            f"wall {r['wall']:7.1f}s goodput {acc.goodput(r['fig'], ideal):.3f} "
            f"generations {r['gens']} lost per re-formation {r['lost']} last step {r['last']} "
            f"share of the row at each world size {r['share']}"
        )


if __name__ == "__main__":
    main()
