"""The goodput benchmark's table (the median [min-max] over the repeats) and its timelines."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench import goodput_accounting as acc
from bench.goodput_jobs import KUBEFLOW
from bench.goodput_rows import PHASES, Recovery, Row
from bench.harness import pct


def write_timelines(out: Path, rows: list[Row]) -> list[Path]:
    """One SVG per row: steps/s over time (5 s buckets), each eviction marked."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, r in enumerate(rows):
        if not r.wall:
            continue
        points = acc.timeline(
            r.step_times, r.t_first, r.t_first + r.wall, bucket=5.0, weights=r.step_samples
        )
        marks = [x.t_evict - r.t_first for x in r.recoveries]
        title = (
            f"{r.policy}/{r.mode}/{r.strategy}, {r.pods_label()} pods: "
            "samples/s (rank 0's steps x world x batch), evictions in red"
        )
        path = out / f"{i:02d}-{r.policy}-{r.mode}-{r.strategy}-{r.pods_label()}pods.svg"
        path.write_text(acc.timeline_svg(title, points, marks, unit=" samples/s"))
        paths.append(path)
    return paths


def report(args: argparse.Namespace, baselines: list[Row], rows: list[Row]) -> None:
    """The table: one line per (policy, mode), the median [min-max] over the repeats."""
    ideal = {**args.ideal, **acc.ideal_rates(r.figures() for r in baselines)}
    _print_setup(args, baselines, ideal)
    head = (
        f"{'policy':<14}{'mode':<10}{'strat':<6}{'pods':>5}{'goodput med [min-max]':>24}"
        f"{'per pod paid':>24}{'per pod-s':>24}{'rec p50':>8}{'rec p95':>8}{'pause50':>8}{'lost':>6}"
        f"{'restarts':>9}{'disr':>5}  " + "  ".join(f"{p:>10}" for p in PHASES)
    )
    print(head)
    print("-" * len(head))
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.policy, r.mode, r.strategy), []).append(r)
    for (policy, mode, strategy), reps in groups.items():
        print(_line(policy, mode, strategy, reps, ideal))
    _print_notes(args, rows)


def _print_setup(args: argparse.Namespace, baselines: list[Row], ideal: dict[str, float]) -> None:
    """What the run did, and each system's ideal rate and where it came from."""
    nominal = args.replicas * args.batch / args.step_seconds
    print()
    print(
        f"goodput under preemption: {args.replicas} worker pods x 1 gloo worker, "
        f"{args.step_seconds}s steps, checkpoint every {args.ckpt_every} steps and on "
        f"should_stop(), grace {args.grace}s, elastic min {args.min_replicas} (Elastic, Standby, "
        f"Kubeflow), a random running pod of the job (standbys "
        f"included) every {args.mtbf}s (+-20%), {args.evictions} per row, {args.repeats} repeat(s)"
    )
    if args.restore_point:
        print(
            "torchjob rows: register_state and a report every step (a hard loss resumes from "
            "the survivors' memory; storage checkpoints are the fallback)"
        )
    for system, rate in sorted(ideal.items()):
        walls = [b.wall for b in baselines if b.figures().system == system]
        where = (
            f"its own baseline row, no evictions, {statistics.median(walls):.0f}s"
            if walls
            else "given with --ideal: an earlier run's baseline row of the same size"
        )
        print(
            f"ideal rate of {system} ({where}): {rate:.1f} samples/s "
            f"({rate / nominal:.2f} of the nominal {nominal:.0f}/s)"
        )


def _phases(recs: list[Recovery]) -> list[str]:
    """The median length of each recovery phase (``PHASES``), formatted for the table."""
    phases = []
    for i, name in enumerate(PHASES):
        prev = "t_evict" if i == 0 else PHASES[i - 1]
        d = [
            x.boundaries[name] - (x.t_evict if prev == "t_evict" else x.boundaries[prev])
            for x in recs
            if x.boundaries
        ]
        phases.append(f"{statistics.median(d):>9.1f}s" if d else f"{'-':>10}")
    return phases


def _line(policy: str, mode: str, strategy: str, reps: list[Row], ideal: dict[str, float]) -> str:
    """The table's line of one (policy, mode, strategy) over its repeats ``reps``."""
    recs = [x for r in reps for x in r.recoveries]
    secs = [x.seconds for x in recs if x.seconds is not None]
    pauses = [x.pause for x in recs if x.pause is not None]
    lost = sum(max(0, x.step_before - x.resumed_step) for x in recs if x.resumed_step is not None)
    goods = [acc.goodput(r.figures(), ideal) for r in reps]
    per_pod = [acc.per_pod_paid(g, r.workers, r.standbys) for g, r in zip(goods, reps, strict=True)]
    per_pod_s = [
        acc.per_pod_second(g, r.workers, r.wall, r.pod_seconds)
        for g, r in zip(goods, reps, strict=True)
    ]
    failed = len(recs) - len(secs)
    disr = (
        "-"
        if any(r.disruptions is None for r in reps)
        else str(sum(r.disruptions or 0 for r in reps))
    )
    notes = sorted({r.note for r in reps if r.note})
    return (
        f"{policy:<14}{mode:<10}{strategy:<6}{reps[0].pods_label():>5}"
        f"{acc.format_spread(goods):>24}{acc.format_spread(per_pod):>24}"
        f"{acc.format_spread(per_pod_s):>24}"
        f"{pct(secs, 0.5):>7.1f}s{pct(secs, 0.95):>7.1f}s{pct(pauses, 0.5):>7.1f}s"
        f"{lost:>6}{sum(r.restarts for r in reps):>9}{disr:>5}  "
        + "  ".join(_phases(recs))
        + (f"   ({failed} not recovered)" if failed else "")
        + (f"   {'; '.join(notes)}" if notes else "")
    )


def _print_notes(args: argparse.Namespace, rows: list[Row]) -> None:
    print("lost, restarts and disr are totals over the repeats; rec and phases over every recovery")
    print(
        "per pod-s = goodput x workers x wall / pod-seconds paid, measured from the trace: a "
        "pod is paid from the kubelet having it until it is gone or terminated (an evicted "
        "pod's grace period and a replacement created ahead overlap, both paid)"
    )
    if any(r.policy == KUBEFLOW for r in rows):
        print(
            "Kubeflow = PyTorchJob v1.8.1, elasticPolicy (c10d on worker-0, min "
            f"{args.min_replicas}, max {args.replicas}) under torchrun; its 'restarts' "
            "are container restarts (no budget is charged), 'disr' is not counted"
        )


# ------------------------------------------------------------------------------ main
