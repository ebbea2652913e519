"""Recompute bench/goodput.py's goodput columns offline from a results directory.

Every row of a run leaves ``NN-POLICY-MODE-STRATEGY[-norp]-events.jsonl.gz`` (rank 0's step events)
and ``-trace.jsonl.gz`` (the pods' trace; uncompressed ``.jsonl`` files are read too) and the row's ``window``) next to its table. This reads them
back through the same accounting (bench/goodput_accounting.py: each system divided by its
own baselines, the samples of the row's window) and prints each row and the median [min-max]
per (policy, mode), so that a published table can be checked, or recomputed when the
accounting changes, without running the hour-long storm again.

What it cannot read back is storage after the row (the runs do not keep it), so the cap of a
row whose final checkpoint failed to commit (``window_samples(saved=...)``) is not applied:
goodput.py's line for such a row says "final checkpoint short".

    python bench/goodput_recompute.py bench/results/2026-11-26l --workers 2 [--standbys 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import goodput_accounting as acc
from bench.harness import data_files, read_jsonl, strip_gz


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("--workers", type=int, required=True, help="the rows' pods (replicas)")
    p.add_argument("--standbys", type=int, default=0, help="standby pods per row (Standby rows)")
    args = p.parse_args(argv)
    rows = []
    plain: list[tuple[str, str, float]] = []
    for f in data_files(args.results, "*-events.jsonl"):
        stem = strip_gz(f.name)[: -len("-events.jsonl")]
        _, policy, mode, strategy, *variant = stem.split("-")
        events = read_jsonl(f)
        trace = read_jsonl(args.results / f"{stem}-trace.jsonl")
        window = next(e for e in trace if e.get("what") == "window")
        t0, t1 = float(window["t0"]), float(window["t1"])
        if variant:  # the baseline without restore points ("norp"): no system's divisor
            plain.append((stem, policy, acc.window_samples(events, t0, t1) / (t1 - t0)))
            continue
        standbys = 0 if mode == acc.BASELINE_MODE else args.standbys
        fig = acc.RowFigures(
            policy, mode, acc.window_samples(events, t0, t1), t1 - t0, args.workers, standbys,
            strategy,
        )  # fmt: skip
        rows.append((stem, fig, acc.pod_seconds(trace, t0, t1)))
    if not rows:
        p.error(f"no *-events.jsonl in {args.results}")
    ideal = acc.ideal_rates(fig for _, fig, _ in rows)
    print("ideal rates (samples/s): " + ", ".join(f"{s} {r:.1f}" for s, r in ideal.items()))
    for stem, policy, rate in plain:
        print(f"  {stem}: {rate:.1f} samples/s without restore points")
        r = ideal.get(acc.system_of(policy))
        if r is not None:
            print(f"  restore point's overhead: 1 - {r:.1f} / {rate:.1f} = {1 - r / rate:+.3f}")
    groups: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
    for stem, fig, paid in rows:
        if fig.mode == acc.BASELINE_MODE:  # each baseline, so that its spread shows
            print(f"  {stem}: {fig.samples} samples in {fig.wall:.1f} s, "
                  f"{fig.samples / fig.wall:.1f} samples/s")  # fmt: skip
            continue
        g = acc.goodput(fig, ideal)
        per_pod = acc.per_pod_paid(g, fig.workers, fig.standbys)
        per_s = acc.per_pod_second(g, fig.workers, fig.wall, paid)
        print(f"  {stem}: {fig.samples} samples in {fig.wall:.1f} s, goodput {g:.3f}, "
              f"per pod paid {per_pod:.3f}, per pod-s {per_s:.3f}")  # fmt: skip
        groups.setdefault((fig.policy, fig.mode, fig.strategy), []).append((g, per_pod, per_s))
    for (policy, mode, strategy), v in groups.items():
        print(
            f"{policy} {mode} {strategy}: goodput {acc.format_spread(x[0] for x in v)}, "
            f"per pod paid {acc.format_spread(x[1] for x in v)}, "
            f"per pod-s {acc.format_spread(x[2] for x in v)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
