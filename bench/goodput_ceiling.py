"""How much of a node-notice row leaves no node free, by the fleet's size: a Monte Carlo of
bench/goodput.py's draw (issue 39's notice rows).

A notice row takes ``--losses`` node notices at Poisson times of mean ``--node-mtbf``
(``goodput_schedule.poisson_times``); each strikes a node that is in (the bench strikes one
that runs a pod of the job: here any node in, the job being spread over all of them) and
holds the draw when every node is out, up to ``goodput_schedule.HOLD_MEANS`` mean intervals. A
struck node is out from its notice until it returns: the notice, then ``--node-return``
seconds gone. While every node is out, the operator has nowhere to put a replacement (it
never places one on a noticed node), so a hand-over must wait for a return: no policy trains
through that time at full size. The row's window is the bench's
(``goodput_schedule.end_of_row``).

    python bench/goodput_ceiling.py [--nodes 3,4,5] [--node-mtbf 120] [--notice 120]
                                    [--node-return 30] [--losses 10] [--draws 2000]

Prints, per fleet size, the mean, median and 90th percentile over the draws of the share of
the window with every node out, and, for 3 nodes, the bench's own three draws (its seeds),
to set beside what ``goodput_profile.py`` measured on the runs (``no_free_node``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import goodput_schedule as sch


def out_intervals(
    times: Sequence[float], nodes: int, out_s: float, rng: random.Random, hold_s: float
) -> list[tuple[float, float]]:
    """Each loss of ``times`` as the interval its node is out: a random node in at the loss's
    time, else (every node out) the first to return, if within ``hold_s``; else skipped."""
    back = [0.0] * nodes
    out: list[tuple[float, float]] = []
    for drawn in times:
        t = drawn if min(back) <= drawn else min(back)
        if t - drawn > hold_s:
            continue
        free = [i for i in range(nodes) if back[i] <= t]
        node = rng.choice(free)
        back[node] = t + out_s
        out.append((t, t + out_s))
    return out


def all_out_s(intervals: Sequence[tuple[float, float]], nodes: int, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which ``nodes`` of the intervals overlap (every node out;
    a node's intervals never overlap one another)."""
    marks = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    total, count, since = 0.0, 0, t0
    for t, step in [*marks, (t1, 0)]:
        t = min(max(t, t0), t1)
        if count >= nodes:
            total += t - since
        count += step
        since = t
    return total


def share(
    rng: random.Random, nodes: int, mtbf: float, notice: float, back_s: float, losses: int
) -> float:
    """One draw's share of the row's window with every node out."""
    times = sch.poisson_times(rng, mtbf, losses)
    intervals = out_intervals(times, nodes, notice + back_s, rng, sch.HOLD_MEANS * mtbf)
    end = sch.end_of_row(0.0, times, mtbf, int(notice))
    return all_out_s(intervals, nodes, 0.0, end) / end


def spare_intervals(
    times: Sequence[float], live: int, spares: int, timing: tuple[float, float, float],
    rng: random.Random, hold_s: float,
) -> list[tuple[float, float]]:  # fmt: skip
    """With spares (bench/goodput_fleet.py): each node's free interval, from the row's start
    or its provision to the notice that strikes it. ``timing``: the notice, the return after
    it is gone (as a spare) and the provision after a notice, in seconds. A notice strikes a
    random free node, held (``hold_s`` at most) when none is; its replacement is the first
    spare back, free ``provision`` after the notice or once that spare is back."""
    notice, back_s, provision = timing
    free: list[list[float]] = [[0.0, float("inf")] for _ in range(live)]
    pool = [0.0] * spares
    for drawn in times:
        ahead = [f[0] for f in free if f[1] == float("inf")]
        t = drawn if any(a <= drawn for a in ahead) else min(ahead, default=float("inf"))
        if t - drawn > hold_s:
            continue
        struck = rng.choice([f for f in free if f[0] <= t < f[1]])
        struck[1] = t
        pool.sort()
        free.append([max(t + provision, pool.pop(0) if pool else float("inf")), float("inf")])
        pool.append(t + notice + back_s)
    return [(a, b) for a, b in free]


def no_free_s(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] that no interval covers (no node free)."""
    total, reach = 0.0, t0
    for a, b in sorted(intervals):
        if a > reach and reach < t1:
            total += min(a, t1) - reach
        reach = max(reach, b)
    return total + max(0.0, t1 - reach)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", default="3,4,5")
    p.add_argument("--node-mtbf", type=float, default=120.0)
    p.add_argument("--notice", type=float, default=120.0)
    p.add_argument("--node-return", type=float, default=30.0)
    p.add_argument("--losses", type=int, default=10)
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spares", type=int, default=0,
                   help="also the fleet with spares (bench/goodput_fleet.py): --nodes in use")  # fmt: skip
    p.add_argument("--provision", type=float, default=60.0)
    a = p.parse_args(argv)
    mode = f"notice{a.notice:.0f}" if a.notice > 0 else "vanish"  # the bench's seeds' names
    print(
        f"{mode}: {a.losses} notices, one every {a.node_mtbf:.0f} s on average, a node out "
        f"{a.notice + a.node_return:.0f} s from its notice to its return; the share of the "
        f"row's window with every node out ({a.draws} draws):"
    )
    for n in (int(x) for x in a.nodes.split(",")):
        rng = random.Random(a.seed)
        xs = sorted(
            share(rng, n, a.node_mtbf, a.notice, a.node_return, a.losses) for _ in range(a.draws)
        )
        line = (
            f"  {n} nodes: mean {statistics.mean(xs):.3f}, median {statistics.median(xs):.3f}, "
            f"p90 {xs[int(0.9 * len(xs))]:.3f}"
        )
        if n == 3:
            own = [
                share(
                    random.Random(f"{a.seed}/{r}/{mode}"),
                    n,
                    a.node_mtbf,
                    a.notice,
                    a.node_return,
                    a.losses,
                )
                for r in range(3)
            ]
            line += "; the bench's draws 0-2: " + ", ".join(f"{x:.3f}" for x in own)
        print(line)
        if a.spares:
            print(f"    with {a.spares} spares, each Ready {a.provision:.0f} s after a notice: "
                  + _spare_shares(a, n, mode))  # fmt: skip


def _spare_shares(a: argparse.Namespace, live: int, mode: str) -> str:
    """The share with no node free with spares: over the draws, then the bench's three."""

    def one(rng: random.Random) -> float:
        times = sch.poisson_times(rng, a.node_mtbf, a.losses)
        timing = (a.notice, a.node_return, a.provision)
        free = spare_intervals(times, live, a.spares, timing, rng, sch.HOLD_MEANS * a.node_mtbf)
        end = sch.end_of_row(0.0, times, a.node_mtbf, int(a.notice))
        return no_free_s(free, 0.0, end) / end

    rng = random.Random(a.seed)
    xs = sorted(one(rng) for _ in range(a.draws))
    own = [one(random.Random(f"{a.seed}/{r}/{mode}")) for r in range(3)]
    return (
        f"mean {statistics.mean(xs):.3f}, median {statistics.median(xs):.3f}, "
        f"p90 {xs[int(0.9 * len(xs))]:.3f}; the bench's draws 0-2: "
        + ", ".join(f"{x:.3f}" for x in own)
    )


if __name__ == "__main__":
    main()
