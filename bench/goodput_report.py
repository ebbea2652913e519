"""The goodput benchmark's table (the median [min-max] over the repeats) and its timelines."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench import goodput_accounting as acc
from bench import goodput_rates as rates
from bench import goodput_schedule as sch
from bench.goodput_jobs import KUBEFLOW
from bench.goodput_records import PHASES, Recovery, Row
from bench.harness import pct


def write_timelines(out: Path, rows: list[Row]) -> list[Path]:
    """One SVG per row: steps/s over time (5 s buckets), each eviction marked; named by the
    row's index, as its events and trace files are."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in rows:
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
        path = (
            out
            / f"{r.index:02d}-{r.policy}-{r.mode}-{r.strategy}{r.suffix}-{r.pods_label()}pods.svg"
        )
        path.write_text(acc.timeline_svg(title, points, marks, unit=" samples/s"))
        paths.append(path)
    return paths


def report(args: argparse.Namespace, baselines: list[Row], rows: list[Row]) -> None:
    """The table: one line per (policy, mode), the median [min-max] over the repeats."""
    ideal = {**args.ideal, **acc.ideal_rates(r.figures() for r in baselines)}
    plain = [r for r in rows if r.mode == acc.BASELINE_MODE]  # baselines without restore points
    rows = [r for r in rows if r.mode != acc.BASELINE_MODE]
    _print_setup(args, baselines, ideal)
    _print_overhead(baselines, plain)
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
    _print_losses(args, rows)


def _spares(args: argparse.Namespace) -> str:
    """How the fleet replaces a noticed node (``--spares``, bench/goodput_fleet.py)."""
    if not getattr(args, "spares", 0):
        return ""
    return (
        f" (a noticed one as a spare: each notice makes one of {args.spares} spares Ready "
        f"{args.provision:.0f}s later)"
    )


def _print_setup(args: argparse.Namespace, baselines: list[Row], ideal: dict[str, float]) -> None:
    """What the run did, and each system's ideal rate and where it came from."""
    nominal = args.replicas * args.batch / args.step_seconds
    print()
    print(
        f"goodput under preemption: {args.replicas} worker pods x 1 gloo worker, "
        f"{args.step_seconds}s steps, checkpoint every {args.ckpt_every} steps and on "
        f"should_stop(), grace {args.grace}s, elastic min {args.min_replicas} (Elastic, Standby, "
        f"Kubeflow), {args.evictions} losses per row ({args.modes}: a random running pod of the "
        f"job, standbys included, or a random node that runs one and not the operator), "
        f"{args.repeats} repeat(s)"
    )
    if args.restore_point:
        print(
            "torchjob rows: register_state and a report every step (a hard loss resumes from "
            "the survivors' memory; storage checkpoints are the fallback)"
        )
    state = f"{args.state_mib} MiB of model + Adam state" if args.state_mib else "Linear(16, 1)"
    print(
        f"each worker: {state}; losses: {args.schedule} schedule, mean interval {args.mtbf}s"
        f"{f' (node modes {args.node_mtbf}s)' if args.node_mtbf else ''}"
        f"{' (exponential gaps)' if args.schedule == 'poisson' else ' (+-20%) after each recovery'}; "
        f"a node taken comes back {args.node_return:.0f}s after it is gone{_spares(args)}"
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
        print(acc.bracket_line(system, [acc.rate(b.samples, b.wall) for b in baselines
                                    if b.figures().system == system and b.wall]))  # fmt: skip


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


def _secs(values: list[float], q: float) -> str:
    """A percentile in seconds for the table (``-`` when nothing recovered)."""
    return f"{pct(values, q):>7.1f}s" if values else f"{'-':>8}"


def _line(policy: str, mode: str, strategy: str, reps: list[Row], ideal: dict[str, float]) -> str:
    """The table's line of one (policy, mode, strategy) over its repeats ``reps``."""
    # A loss that took no member (only pods still joining) has no recovery to time.
    recs = [x for r in reps for x in r.recoveries if not x.trained_on]
    secs = [x.seconds for x in recs if x.seconds is not None]
    pauses = [x.pause for x in recs if x.pause is not None]
    lost = sum(r.redone for r in reps)
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
        f"{_secs(secs, 0.5)}{_secs(secs, 0.95)}{_secs(pauses, 0.5)}"
        f"{lost:>6}{sum(r.restarts for r in reps):>9}{disr:>5}  "
        + "  ".join(_phases(recs))
        + (f"   ({failed} not recovered)" if failed else "")
        + (f"   {'; '.join(notes)}" if notes else "")
    )


def _print_notes(args: argparse.Namespace, rows: list[Row]) -> None:
    print(
        "lost (steps done again, whichever loss they follow), restarts and disr are totals over"
        " the repeats; rec and phases over every recovery"
    )
    print(
        "rec = from the loss (a noticeN row: the notice) to the first completed step of a "
        "generation above the one stepping at the loss (resolved after the row, so overlapping "
        "losses each get theirs); a loss without one is listed below, not dropped"
    )
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


def _print_overhead(baselines: list[Row], plain: list[Row]) -> None:
    """The restore point's overhead: 1 - rate(with) / rate(without), from the torchjob
    baselines (with restore points) and the same job without them (``acc.overhead_line``)."""
    if not plain:
        return
    with_rp = [acc.rate(r.samples, r.wall) for r in baselines if r.restore_point and r.wall]
    without = [acc.rate(r.samples, r.wall) for r in plain if r.wall]
    print(acc.overhead_line(with_rp, without))


def _print_losses(args: argparse.Namespace, rows: list[Row]) -> None:
    """Per row: the losses taken against the stated mean, how many pods each took, every
    loss that did not recover (a failed re-formation: listed, never dropped), and rank 0's
    step rate in each full-size generation (slower after a loss?)."""
    print("losses per row (realised against the stated mean interval):")
    for r in rows:
        if not r.wall:
            print(f"  {r.index:02d} {r.policy}/{r.mode}: no window ({r.note})")
            continue
        n = len(r.recoveries)
        realised = sch.realised_rate(n, r.wall)
        stated = sch.mean_interval(r.mode, args.mtbf, args.node_mtbf)
        mean = f"1 per {r.wall / n:.0f}s" if n else "none"
        mean += f", stated 1 per {stated:.0f}s = {1 / stated:.4f}/s"
        pods = ",".join(str(len(x.pods)) for x in r.recoveries) or "-"
        members = ",".join(
            "?" if x.members_lost is None else str(x.members_lost) for x in r.recoveries
        )
        print(
            f"  {r.index:02d} {r.policy}/{r.mode}/{r.strategy}: {n} losses in {r.wall:.0f}s = "
            f"{realised:.4f}/s ({mean}); pods per loss: {pods}; members per loss: {members}"
        )
        for x in r.recoveries:
            if x.trained_on:
                print(
                    f"     took no member (the job trained on; not a recovery): {x.describe(r.t_first)}"
                )
        for x in r.recoveries:
            if x.first_step is None and not x.trained_on:
                left = r.t_first + r.wall - x.t_evict
                why = (
                    f"within {args.start_timeout:.0f}s"
                    if left >= args.start_timeout
                    else f"in the {left:.0f}s left of the row"
                )
                print(f"     NOT RECOVERED {why}: {x.describe(r.t_first)}")
        held = [f"{x.held:.0f}s" for x in r.recoveries if x.held >= 1]
        if held:
            print(f"     held for something to take: {', '.join(held)}")
        for skipped in r.skipped:
            print(f"     skipped (nothing to take): {skipped}")
        print(f"     full-size rate by generation: {rates.describe(r.gen_rates)}")
