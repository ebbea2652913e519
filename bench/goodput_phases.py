"""A row's re-formations cut into their phases, and how long its node faults left no node free.

``bench/goodput_profile.py`` prints both beside a row's generations: the first says what each
re-formation cost and where (the new processes in the group, every rank restored, the first
and second steps after it), by kind (a shrink, a grow, a hand-over to new processes); the
second how much of the row the issue's rule (a replacement never goes to a noticed node) left
without a place for a replacement at all, which no policy can train through at full size.
"""

from __future__ import annotations

import itertools
from typing import Any


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _kind(before: int, after: int, new: int) -> str:
    """What a re-formation was, from its world sizes and how many processes were new to it."""
    if after < before:
        return "shrink"
    if after > before:
        return "grow"
    return "hand-over" if new else "same members"


def _s(v: float) -> str:
    return "-" if v != v else f"{v:.2f}s"  # NaN: no such phase (no new process)


def reformations(events: list[dict[str, Any]]) -> list[str]:
    """Each re-formation, from the workers' events alone: seconds from the previous
    generation's last step to the last new process in the group (``new``: the processes whose
    first group is this one, which receive the state) and to every rank restored; then the
    first step after the restore and the second step's length. ``cost``: the gap to the first
    step less one median step, plus the second step's excess over one (a joiner's first steps
    run slower). Then the median of each phase by kind: a shrink, a grow, a hand-over (the
    same size, new processes) or the same members again."""
    events = sorted(events, key=lambda e: e["t"])
    steps = [e for e in events if e["ev"] == "step"]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(steps) if a["gen"] == b["gen"]]
    if not gaps:
        return []
    med = median(gaps)
    # A process is its pod's name, its pid and which start of that pod name it follows: a
    # replacement reuses a lost pod's name, and a container's pids repeat (2026-12-06h: a
    # hand-over read as "the same members" because the new gp-worker-9's trainer was pid 11
    # like the old one's).
    starts: dict[Any, int] = {}
    process: dict[int, tuple[Any, Any, int]] = {}
    first_group: dict[tuple[Any, Any, int], int] = {}
    for e in events:
        if e["ev"] == "start":
            starts[e.get("pod")] = starts.get(e.get("pod"), 0) + 1
        key = (e.get("pod"), e.get("pid"), starts.get(e.get("pod"), 0))
        process[id(e)] = key
        if e["ev"] == "group":
            first_group.setdefault(key, e["gen"])

    def _new(e: dict[str, Any], gen: int) -> bool:
        return first_group.get(process[id(e)]) == gen

    out = [f"re-formations (the median step {med:.2f}s):"]
    kinds: dict[str, dict[str, list[float]]] = {}
    for prev, cur in itertools.pairwise(steps):
        if cur["gen"] == prev["gen"]:
            continue
        gen, t0 = cur["gen"], prev["t"]
        mine = [e for e in events if e["gen"] == gen and t0 <= e["t"] <= cur["t"]]
        new = sum(1 for e in mine if e["ev"] == "group" and _new(e, gen))
        nxt = next((s for s in steps if s["gen"] == gen and s["step"] == cur["step"] + 1), None)
        second = nxt["t"] - cur["t"] if nxt is not None else med
        joined = [e["t"] for e in mine if e["ev"] == "group" and _new(e, gen)]
        restored = max((e["t"] for e in mine if e["ev"] == "restored"), default=t0)
        phases = {
            "new in the group": max(joined) - t0 if joined else float("nan"),
            "every rank restored": restored - t0,
            "first step": cur["t"] - restored,
            "second step": second,
            "cost": cur["t"] - t0 - med + max(second - med, 0.0),
        }
        kind = _kind(prev["world"], cur["world"], new)
        for k, v in phases.items():
            kinds.setdefault(kind, {}).setdefault(k, []).append(v)
        out.append(
            f"  gen {gen:2d} {kind} {prev['world']}->{cur['world']}, {new} new: "
            + ", ".join(f"{k} {_s(v)}" for k, v in phases.items())
        )
    for kind, phases in kinds.items():
        n = len(phases["cost"])
        p50 = {k: median([v for v in vs if v == v] or [float("nan")]) for k, vs in phases.items()}
        out.append(f"{kind} (n={n}), p50: " + ", ".join(f"{k} {_s(v)}" for k, v in p50.items()))
    return out


NODE_LOSSES = ("vanish", "notice30", "notice120")
"""The trace's node faults (bench/goodput_losses.py): from each, its node is no place for a
replacement until its ``returned`` line."""


def no_free_node(trace: list[dict[str, Any]]) -> str | None:
    """How long, inside the row's window, no spot node was free for a replacement: every node
    the row's faults struck noticed or gone at once (it never places one on a noticed node),
    so the job can only train on, on nodes about to go, or wait. With spares
    (bench/goodput_fleet.py: the trace's ``fleet`` line), a node is free from the row's start
    or its provision (``provisioned``) until a fault strikes it; a node that returns as a
    spare frees nothing. None for a row without node faults or a window."""
    window = next((e for e in trace if e["what"] == "window"), None)
    kinds = (*NODE_LOSSES, "returned", "provisioned")
    faults = sorted((e for e in trace if e["what"] in kinds), key=lambda e: e["t"])
    nodes = {e["node"] for e in faults if e["what"] in NODE_LOSSES}
    if window is None or not nodes:
        return None
    fleet = next((e for e in trace if e["what"] == "fleet"), None)
    free = set(fleet["live"]) if fleet else set(nodes)
    t0, t1 = float(window["t0"]), float(window["t1"])
    total, since = 0.0, t0
    for e in [*faults, {"t": t1, "what": "end", "node": ""}]:
        t = min(max(float(e["t"]), t0), t1)
        if not free:
            total += t - since
        since = t
        if e["what"] in NODE_LOSSES:
            free.discard(e["node"])
        elif e["what"] == "provisioned" or (e["what"] == "returned" and not e.get("spare")):
            free.add(e["node"])
    what = (
        f"no spot node free ({len(fleet['live'])} in use, {len(fleet['spares'])} spares)"
        if fleet
        else f"every node the faults struck ({len(nodes)}) noticed or gone at once"
    )
    return f"{what}: {total:.1f}s of the {t1 - t0:.1f}s window ({total / max(t1 - t0, 1e-9):.3f})"
