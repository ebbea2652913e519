"""A row's generations from its events file (bench/goodput.py writes one per row under a
``tj-goodput-<index>-*`` temporary directory): each generation's world size, how long it
trained, the gap before it (the re-formation), the share of the row at each world size, and
how long the replacement processes took to import torch and to join a group. It shows what
a goodput figure is made of: an eviction's re-formation, or the time spent smaller while a
replacement pod starts.

    python bench/goodput_profile.py /tmp/tj-goodput-2-*/events.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def profile(events: list[dict[str, Any]]) -> list[str]:
    steps = [e for e in events if e["ev"] == "step"]
    if not steps:
        return ["no step"]
    t0, t_end = steps[0]["t"], steps[-1]["t"]
    gens: dict[int, list[dict[str, Any]]] = {}
    for e in steps:
        gens.setdefault(e["gen"], []).append(e)
    out, at_size, prev_end = [], {}, None
    for gen, s in sorted(gens.items()):
        world, dur = s[0]["world"], s[-1]["t"] - s[0]["t"]
        at_size[world] = at_size.get(world, 0.0) + dur
        gap = "" if prev_end is None else f" gap {s[0]['t'] - prev_end:5.1f}s"
        out.append(
            f"gen {gen:2d} world {world} from {s[0]['t'] - t0:6.1f}s for {dur:6.1f}s "
            f"steps {s[0]['step']}-{s[-1]['step']}{gap}"
        )
        prev_end = s[-1]["t"]
    span = max(t_end - t0, 1e-9)
    shares = ", ".join(f"{w}: {d:.0f}s ({d / span:.0%})" for w, d in sorted(at_size.items()))
    out.append(f"time at each world size: {shares}")
    late = [e for e in events if e["ev"] == "start" and e["t"] - t0 > 5]  # replacements
    # Every container's processes have small pids (the same in every pod), and a replacement
    # pod may carry its predecessor's name: a process is its pod, its pid and its start.
    imports = [
        min(i["t"] for i in found) - e["t_start"]
        for e in late
        if (
            found := [
                i
                for i in events
                if i["ev"] == "imported"
                and (i.get("pod"), i["pid"]) == (e.get("pod"), e["pid"])
                and i["t"] >= e["t"]
            ]
        )
    ]
    if imports:
        out.append(
            f"replacement processes: start -> torch and torchjob imported p50 "
            f"{median(imports):.1f}s, max {max(imports):.1f}s (n={len(imports)})"
        )
    group = {(e["pod"], e["pid"]): e["t"] for e in events if e["ev"] == "group"}
    joins = [group[(e["pod"], e["pid"])] - e["t"] for e in late if (e["pod"], e["pid"]) in group]
    if joins:
        out.append(
            f"replacement processes: start -> first group p50 {median(joins):.1f}s, "
            f"max {max(joins):.1f}s (n={len(joins)})"
        )
    return out


def main() -> None:
    events = []
    for line in Path(sys.argv[1]).read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    print("\n".join(profile(events)))


if __name__ == "__main__":
    main()
