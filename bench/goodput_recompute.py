"""Recompute bench/goodput.py's goodput columns offline from a results directory.

Every row of a run leaves ``NN-POLICY-MODE-STRATEGY[-norp]-events.jsonl.gz`` (rank 0's step events)
and ``-trace.jsonl.gz`` (the pods' trace; uncompressed ``.jsonl`` files are read too) and the row's ``window``) next to its table. This reads them
back through the same accounting (bench/goodput_accounting.py: each system divided by its
own baselines, the samples of the row's window) and prints each row and the median [min-max]
per (policy, mode), so that a published table can be checked, or recomputed when the
accounting changes, without running the hour-long storm again.

Storage after the row is gone (the runs do not keep it), but the trace says what it held
(its ``storage`` line, ``committed``: written since 2026-12-03), so the cap of a row whose
final checkpoint fell short (``window_samples(saved=...)``) is applied as goodput.py applies
it, to every row but the baselines, and both give the same figure. A row from before has no
such line: it is read without the cap, and said so (goodput.py's own line for such a row
says "final checkpoint short").

Several results directories (the parts of one long run, bench/goodput_runs.py) are read as one
table: each part's rows divided by that part's own baselines, the median [min-max] taken over
every part's rows of a (policy, mode); parts that ran different code are refused (``--mixed``
reads them anyway, and says so).

    python bench/goodput_recompute.py bench/results/2026-11-26l --workers 2 [--standbys 0]
    python bench/goodput_recompute.py bench/results/2026-12-01a/* --workers 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import goodput_accounting as acc
from bench import goodput_runs as runs_mod
from bench.harness import data_files, read_jsonl, strip_gz

Part = tuple[
    list[tuple[str, acc.RowFigures, float]], list[tuple[str, str, float]], dict[str, float | None]
]


def _part(folder: Path, workers: int, standbys: int) -> Part:
    """One results directory's rows (stem, figures, pod-seconds paid), its baselines without
    restore points (stem, policy, samples/s) and every baseline's rate from its step times
    (stem: ``acc.step_rate``)."""
    rows = []
    plain: list[tuple[str, str, float]] = []
    timed: dict[str, float | None] = {}
    for f in data_files(folder, "*-events.jsonl"):
        stem = strip_gz(f.name)[: -len("-events.jsonl")]
        _, policy, mode, strategy, *variant = stem.split("-")
        events = read_jsonl(f)
        trace = read_jsonl(folder / f"{stem}-trace.jsonl")
        window = next(e for e in trace if e.get("what") == "window")
        t0, t1 = float(window["t0"]), float(window["t1"])
        if mode == acc.BASELINE_MODE:
            timed[stem] = acc.step_rate(events, t0, t1)
        if variant:  # the baseline without restore points ("norp"): no system's divisor
            plain.append((stem, policy, acc.window_samples(events, t0, t1) / (t1 - t0)))
            continue
        kept = next((e for e in trace if e.get("what") == "storage"), None)
        if kept is None:
            print(f"  {stem}: no storage line in the trace (an older run): read without the cap")
        saved = None if kept is None or mode == acc.BASELINE_MODE else int(kept["committed"])
        fig = acc.RowFigures(
            policy, mode, acc.window_samples(events, t0, t1, saved=saved), t1 - t0, workers,
            0 if mode == acc.BASELINE_MODE else standbys, strategy,
        )  # fmt: skip
        rows.append((stem, fig, acc.pod_seconds(trace, t0, t1)))
    return rows, plain, timed


def _print_part(
    name: str, part: Part, groups: dict[tuple[str, str, str], list[tuple[float, float, float]]]
) -> None:
    """A part's ideal rates and rows, each divided by the part's own baselines; its rows'
    figures added to ``groups``."""
    rows, plain, timed = part
    ideal = acc.ideal_rates(fig for _, fig, _ in rows)
    prefix = f"{name}: " if name else ""
    print(
        prefix + "ideal rates (samples/s): " + ", ".join(f"{s} {r:.1f}" for s, r in ideal.items())
    )
    measured: dict[str, list[float]] = {}  # each system's baselines in the order run
    for _, fig, _ in rows:
        if fig.mode == acc.BASELINE_MODE and fig.wall:
            measured.setdefault(fig.system, []).append(fig.samples / fig.wall)
    for system in ideal:
        print(acc.bracket_line(system, measured.get(system, [])))
    for stem, _, rate in plain:
        print(f"  {stem}: {rate:.1f} samples/s without restore points")
    if plain:
        with_rp = measured.get(acc.system_of(plain[0][1]), [])
        print("  " + acc.overhead_line(with_rp, [rate for _, _, rate in plain]))
        _print_timed_overhead(rows, plain, timed)
    for stem, fig, paid in rows:
        if fig.mode == acc.BASELINE_MODE:  # each baseline, so that its spread shows
            print(f"  {stem}: {fig.samples} samples in {fig.wall:.1f} s, "
                  f"{fig.samples / fig.wall:.1f} samples/s")  # fmt: skip
            continue
        if acc.system_of(fig.policy, fig.strategy) not in ideal:
            print(f"  {stem}: no baseline of its system in this part; not counted")
            continue
        g = acc.goodput(fig, ideal)
        per_pod = acc.per_pod_paid(g, fig.workers, fig.standbys)
        per_s = acc.per_pod_second(g, fig.workers, fig.wall, paid)
        print(f"  {stem}: {fig.samples} samples in {fig.wall:.1f} s, goodput {g:.3f}, "
              f"per pod paid {per_pod:.3f}, per pod-s {per_s:.3f}")  # fmt: skip
        groups.setdefault((fig.policy, fig.mode, fig.strategy), []).append((g, per_pod, per_s))


def _print_timed_overhead(
    rows: list[tuple[str, acc.RowFigures, float]],
    plain: list[tuple[str, str, float]],
    timed: dict[str, float | None],
) -> None:
    """The overhead again from the baselines' step times (``acc.step_rate``): whole steps
    counted in a 150 s window resolve ~1.1 %, about the overhead itself."""
    system = acc.system_of(plain[0][1])
    with_rp = [
        timed[stem]
        for stem, fig, _ in rows
        if fig.mode == acc.BASELINE_MODE and fig.system == system
    ]
    without = [timed[stem] for stem, _, _ in plain]
    each = [r for r in with_rp if r is not None], [r for r in without if r is not None]
    print("  from step times: " + acc.overhead_line(*each))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("results", type=Path, nargs="+", help="one results directory per part")
    p.add_argument("--workers", type=int, required=True, help="the rows' pods (replicas)")
    p.add_argument("--standbys", type=int, default=0, help="standby pods per row (Standby rows)")
    p.add_argument("--mixed", action="store_true", help="read parts that ran different code")
    args = p.parse_args(argv)
    parts = [d for d in args.results if d.is_dir()]
    if len(parts) > 1:
        runs = {d.name: runs_mod.read_run(d) for d in parts}
        print("parts:\n" + runs_mod.describe(runs.items()))
        problems = runs_mod.code_differences(runs)
        for problem in problems:
            print(f"  {'MIXED: ' if args.mixed else ''}{problem}", file=sys.stderr)
        if problems and not args.mixed:
            p.error("the parts did not all run the same code (--mixed reads them anyway)")
    groups: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
    for folder in parts:
        part = _part(folder, args.workers, args.standbys)
        if not part[0]:
            p.error(f"no *-events.jsonl in {folder}")
        _print_part(folder.name if len(parts) > 1 else "", part, groups)
    for (policy, mode, strategy), v in groups.items():
        print(
            f"{policy} {mode} {strategy}: goodput {acc.format_spread(x[0] for x in v)}, "
            f"per pod paid {acc.format_spread(x[1] for x in v)}, "
            f"per pod-s {acc.format_spread(x[2] for x in v)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
