"""A row's generations from its events file (bench/goodput.py writes one per row under a
``tj-goodput-<index>-*`` temporary directory): each generation's world size, how long it
trained, the gap before it (the re-formation), the share of the row at each world size, and
how long the replacement processes took to import torch and to join a group. It shows what
a goodput figure is made of: an eviction's re-formation, or the time spent smaller while a
replacement pod starts.

With the row's trace (``NN-<row>-trace.jsonl.gz``, which bench/goodput.py writes beside the
events under ``--out``: what the control plane said when), each preemption is split further
into what Kubernetes took and what the runtime took:

* the loss: preempted -> the pod's container seen terminated (the kubelet's report) -> the
  next generation published (the operator) -> the survivors' group formed -> their first
  step;
* the replacement: its pod created -> its process started -> torch imported -> the pod Ready
  (the joiner's readiness probe) -> the generation that takes it in published (the first
  whose members hold its index; one published before the pod was Ready, as when a second
  loss comes while the first one's replacement starts, takes it in at Ready: 0 s, or the
  stage's sign says the order) -> its group formed.

and the pods paid over the row (``goodput_accounting.pod_seconds``).

    python bench/goodput_profile.py bench/out/goodput/01-Elastic-hard-ddp-events.jsonl.gz \
        [--ideal 1853]   # with the row's ideal rate: what each preemption cost
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import goodput_accounting as acc
from bench.goodput_budget import against_quiet, budget, budget_line, full_step_samples
from bench.goodput_cpu import cpu_lines
from bench.goodput_phases import median, no_free_node, reformations
from bench.harness import read_jsonl as _read


def profile(events: list[dict[str, Any]]) -> list[str]:
    steps = [e for e in events if e["ev"] == "step"]
    if not steps:
        return ["no step"]
    t0, t_end = steps[0]["t"], steps[-1]["t"]
    gens: dict[int, list[dict[str, Any]]] = {}
    for e in steps:
        gens.setdefault(e["gen"], []).append(e)
    out: list[str] = []
    at_size: dict[int, float] = {}
    prev_end = None
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
    out.append(f"steps done again: {acc.steps_redone(e['step'] for e in steps)}")
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


def _first(items: list[dict[str, Any]], after: float, pred: Any) -> dict[str, Any] | None:
    return next((e for e in items if e["t"] >= after and pred(e)), None)


Stages = dict[str, list[float]]


def _stages(t0: float, marks: list[tuple[str, dict[str, Any] | None]], into: Stages) -> list[str]:
    line, prev = [], t0
    for label, e in marks:
        if not e:
            continue
        into.setdefault(label, []).append(e["t"] - prev)
        line.append(f"{label} {e['t'] - prev:+.2f}s")
        prev = max(prev, e["t"])
    return line


def _taking(
    trace: list[dict[str, Any]], ready: dict[str, Any], name: str, gen1: int
) -> dict[str, Any] | None:
    """The generation that takes the Ready replacement in: the first whose members hold its
    index. The operator may publish it before the pod is Ready (a generation formed around a
    replacement already on its way waits for it): then it took the pod in at once, at Ready.
    Before, this was the first generation after the loss's *next* one, and a replacement
    that generation held was paired with one 42 s later (2026-12-07b, kill 7)."""
    index = int(name.rsplit("-", 1)[1])

    def holds(e: dict[str, Any]) -> bool:
        return (
            e["what"] == "job"
            and (e["generation"] or 0) >= gen1
            and index in (e.get("members") or ())
        )

    jobs = [e for e in trace if e["what"] == "job" and e["t"] <= ready["t"]]
    if jobs and holds(jobs[-1]):
        return {**jobs[-1], "t": ready["t"]}
    return _first(trace, ready["t"], holds)


def _split_one(
    hit: dict[str, Any],
    events: list[dict[str, Any]],
    trace: list[dict[str, Any]],
    loss: Stages,
    join: Stages,
) -> list[str]:
    t0, name = hit["t"], hit["pod"]
    before = [e for e in trace if e["what"] == "job" and e["t"] <= t0]
    gen0 = (before[-1]["generation"] if before else 0) or 0
    dead = _first(
        trace,
        t0,
        lambda e: (
            e["what"] == "pod"
            and e["pod"] == name
            and (
                e["deleting"]
                or e["phase"] in ("Failed", "Succeeded")
                or any(c.startswith("terminated") for c in e["containers"])
            )
        ),
    )
    pub = _first(trace, t0, lambda e: e["what"] == "job" and (e["generation"] or 0) > gen0)
    if pub is None:
        return [f"{hit['what']} {name}: no generation published after it"]
    gen1 = pub["generation"]
    group = _first(events, t0, lambda e: e["ev"] == "group" and e["gen"] == gen1)
    step = _first(events, t0, lambda e: e["ev"] == "step" and e["gen"] == gen1)
    marks = [
        ("kubelet reports the pod", dead),
        ("generation published", pub),
        ("group formed", group),
        ("first step", step),
    ]
    out = [f"{hit['what']} {name} (gen {gen0} -> {gen1}): " + ", ".join(_stages(t0, marks, loss))]
    # The replacement: the first pod seen after the loss that was not there before it (a new
    # pod of that name, or, where the job creates its places under new indices, of another
    # one: matching by name paired a kill with a later pod of the same name, seconds after
    # the real replacement had joined), and the generation that takes it in.
    known = {e["uid"] for e in trace if e["what"] == "pod" and e["t"] <= t0}
    created = _first(trace, t0, lambda e: e["what"] == "pod" and e["uid"] not in known)
    if created is None:
        return out
    tc, name = created["t"], created["pod"]
    start = _first(events, tc - 1.0, lambda e: e["ev"] == "start" and e.get("pod") == name)
    imported = None
    if start is not None:
        key = (name, start["pid"])
        imported = _first(
            events, start["t"], lambda e: e["ev"] == "imported" and (e.get("pod"), e["pid"]) == key
        )
    uid = created["uid"]
    ready = _first(trace, tc, lambda e: e["what"] == "pod" and e["uid"] == uid and e["ready"])
    taken = joined = None
    if ready is not None:
        taken = _taking(trace, ready, name, gen1)
    if taken is not None:
        gen2 = taken["generation"]
        joined = _first(events, taken["t"], lambda e: e["ev"] == "group" and e["gen"] == gen2)
    jmarks = [
        ("process started", start),
        ("torch imported", imported),
        ("pod Ready", ready),
        ("generation published", taken),
        ("group formed", joined),
    ]
    out.append(
        f"  replacement pod created +{tc - t0:.2f}s: " + ", ".join(_stages(tc, jmarks, join))
    )
    return out


def split_recoveries(events: list[dict[str, Any]], trace: list[dict[str, Any]]) -> list[str]:
    """Each preemption of the trace, split into its stages (seconds since the one before)."""
    events = sorted(events, key=lambda e: e["t"])
    trace = sorted(trace, key=lambda e: e["t"])
    loss: Stages = {}
    join: Stages = {}
    out = []
    for hit in (e for e in trace if e["what"] in ("kill", "evict")):
        out.extend(_split_one(hit, events, trace, loss, join))
    for title, stages in (("the loss", loss), ("the replacement", join)):
        if stages:
            out.append(
                f"{title}, p50 of each stage: "
                + ", ".join(f"{k} {median(v):.2f}s" for k, v in stages.items())
            )
    return out


def shortfall_window(
    events: list[dict[str, Any]], trace: list[dict[str, Any]]
) -> tuple[float, float] | None:
    """The row's window, bench/goodput.py's wall time: its trace's ``window`` line (the first
    step to the row's end, when the bench deletes the job); in older traces, the first to the
    last step. None without a step."""
    window = next((e for e in trace if e["what"] == "window"), None)
    if window is not None:
        return float(window["t0"]), float(window["t1"])
    steps = [float(e["t"]) for e in events if e["ev"] == "step"]
    return (min(steps), max(steps)) if steps else None


def pods_paid(events: list[dict[str, Any]], trace: list[dict[str, Any]]) -> str:
    """The pod-seconds paid over the row's window (``shortfall_window``), and the pods that
    makes on average."""
    window = shortfall_window(events, trace)
    if window is None:
        return "pods paid: no window (no step)"
    t0, t1 = window
    paid = acc.pod_seconds(trace, t0, t1)
    return f"pods paid: {paid:.1f} pod-s over {t1 - t0:.1f}s, {paid / max(t1 - t0, 1e-9):.3f} on average"


def stopped_pods(trace: list[dict[str, Any]]) -> str | None:
    """How long the pods deleted while they ran, and that stopped as asked (exit code 75,
    not a lost node's 137), took to go: the deletion -> their processes' exit (the kubelet's
    ``finishedAt``, whole seconds; traces from before 2026-12-06 lack it) -> the kubelet's
    report (Failed) -> gone. A leaver is paid until it is gone."""
    asked: dict[str, float] = {}
    spans: dict[str, list[float]] = {"exited": [], "reported": [], "gone": []}
    reported: dict[str, float] = {}
    for e in sorted(trace, key=lambda e: e["t"]):
        uid = e.get("uid")
        if e["what"] == "pod" and uid is not None:
            if e["deleting"] and e["phase"] == "Running" and uid not in asked:
                asked[uid] = e["t"]
            ended = e["phase"] in ("Failed", "Succeeded")
            if uid in asked and ended and uid not in reported:
                if e["containers"] == ["terminated:75"]:
                    reported[uid] = e["t"]
                    spans["reported"].append(e["t"] - asked[uid])
                    if "finished" in e:
                        spans["exited"].append(e["finished"] - asked[uid])
                else:
                    reported[uid] = float("nan")
        elif e["what"] == "pod-gone" and uid in reported and reported[uid] == reported[uid]:
            spans["gone"].append(e["t"] - asked[uid])
    if not spans["reported"]:
        return None
    parts = [f"{k} p50 {median(v):.1f}s" for k, v in spans.items() if v]
    return f"pods that stopped when deleted (n={len(spans['reported'])}), from the deletion: " + (
        ", ".join(parts)
    )


def preemption_costs(
    events: list[dict[str, Any]], trace: list[dict[str, Any]], ideal_rate: float
) -> list[str]:
    """Each preemption's cost in seconds of ideal training (``acc.preemption_costs``), and
    what they add up to against the whole row's shortfall: the rest is the stretches between
    preemptions running below the ideal rate (another run's baseline, machine drift).

    The row is bench/goodput.py's: its window (``shortfall_window``) and the samples trained
    in it (``acc.window_samples``), so that 1 - the shortfall is the row's goodput for the
    same ideal rate. Steps after the window (an elastic pod's drain once the bench deleted
    the job) are not the row's."""
    steps = sorted((e for e in events if e["ev"] == "step"), key=lambda e: e["t"])
    hits = [e["t"] for e in trace if e["what"] in ("kill", "evict")]
    costs = acc.preemption_costs(steps, hits, ideal_rate)
    out = [
        f"  preempted +{c.at - steps[0]['t']:.1f}s: back at full size {c.until - c.at:.1f}s "
        f"later, {c.delivered:.3f} of the ideal rate meanwhile, pause {c.pause:.2f}s, "
        f"cost {c.lost_s:.2f}s"
        for c in costs
    ]
    window = shortfall_window(events, trace)
    if window is not None and costs:
        t0, t1 = window
        wall = t1 - t0
        short = wall - acc.window_samples(events, t0, t1) / ideal_rate
        lost = sum(c.lost_s for c in costs)
        out.append(
            f"preemptions cost {lost:.1f}s of {wall:.1f}s ({lost / wall:.3f}; pauses "
            f"{sum(c.pause for c in costs):.1f}s); the row's whole shortfall "
            f"{short:.1f}s ({short / wall:.3f})"
        )
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A row's events or trace, plain or gzip-compressed (``.jsonl.gz``, as bench/results
    keeps them); a cut last line is skipped."""
    return _read(path, partial=True)


def main() -> None:
    """``EVENTS [TRACE] [--ideal SAMPLES_PER_S]`` (the ideal rate: the row's baseline, which
    the bench prints; with it, each preemption's cost)."""
    args = sys.argv[1:]
    ideal = None
    if "--ideal" in args:
        at = args.index("--ideal")
        ideal = float(args[at + 1])
        del args[at : at + 2]
    path = Path(args[0])
    events = read_jsonl(path)
    print("\n".join(profile(events)))
    print("\n".join(reformations(events)))
    trace_path = (
        Path(args[1])
        if len(args) > 1
        else path.with_name(path.name.replace("-events.jsonl", "-trace.jsonl"))
    )
    gz = trace_path.with_name(trace_path.name + ".gz")
    if trace_path != path and (trace_path.exists() or gz.exists()):
        trace = read_jsonl(trace_path)
        print("\n".join(split_recoveries(events, trace)))
        print(pods_paid(events, trace))
        if (stopped := stopped_pods(trace)) is not None:
            print(stopped)
        window = shortfall_window(events, trace)
        workers = max((int(e["world"]) for e in events if e["ev"] == "step"), default=0)
        if window is not None and (b := budget(events, trace, window, workers)) is not None:
            print(budget_line(b))
            if (per_step := full_step_samples(events, workers)) is not None:
                kept = acc.window_samples(events, *window)
                print(f"against it: {against_quiet(b, kept, per_step):.3f} ({kept} kept)")
        if (free := no_free_node(trace)) is not None:
            print(free)
        steps = [e["t"] for e in events if e["ev"] == "step"]
        print("\n".join(cpu_lines(trace, min(steps), max(steps)) if steps else []))
        if ideal is not None:
            print("\n".join(preemption_costs(events, trace, ideal)))


if __name__ == "__main__":
    main()
