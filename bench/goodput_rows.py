"""One row of the goodput benchmark: a job started, a storm of preemptions (graceful evictions
or SIGKILLs on the node), each recovery timed from the workers' events, and what the row
trained in its window (bench/goodput_accounting.py counts it)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import kube as k

from bench import goodput_accounting as acc
from bench.goodput_jobs import JOB, KUBEFLOW, kubeflow_manifest, manifest
from bench.goodput_watch import PodWatch
from bench.harness import copy_compressed, has_default_sa, logger, read_jsonl
from torchjob.api.models import GROUP, PLURAL, VERSION

log = logger("goodput")
PHASES = ("reaction", "pod start", "imports", "group", "DDP", "restore", "first step")
EVENT_ORDER = ("start", "imported", "group", "model", "restored")


def read_events(path: Path) -> list[dict[str, Any]]:
    """The workers' events so far (a line being written is skipped)."""
    return read_jsonl(path, partial=True)


@dataclass
class Recovery:
    t_evict: float
    pod: str
    gen_before: int
    step_before: int = 0
    boundaries: dict[str, float] = field(default_factory=dict)
    first_step: float | None = None
    resumed_step: int | None = None
    pause: float | None = None
    """The longest stretch without a step from the preemption to ``first_step``
    (``acc.longest_pause``)."""

    @property
    def seconds(self) -> float | None:
        return None if self.first_step is None else self.first_step - self.t_evict


@dataclass
class Row:
    policy: str
    mode: str
    strategy: str = "ddp"
    wall: float = 0.0
    samples: int = 0
    """What the row trained in its window (``acc.window_samples``): goodput's numerator."""
    committed: int = 0
    """What storage held after the row (``acc.committed_samples``): a check, not goodput."""
    recoveries: list[Recovery] = field(default_factory=list)
    restarts: int = 0
    """TorchJob: ``status.restarts``; Kubeflow: container restarts of the pods left at the end."""
    disruptions: int | None = 0
    note: str = ""
    workers: int = 0
    standbys: int = 0
    step_times: list[float] = field(default_factory=list)
    """Wall-clock times of rank 0's steps (the timeline)."""
    step_samples: list[float] = field(default_factory=list)
    """The samples of each of those steps (world size x batch)."""
    t_first: float = 0.0
    pod_seconds: float = 0.0
    """Pod-seconds paid over [t_first, t_first + wall], from the trace (``acc.pod_seconds``)."""

    def pods_label(self) -> str:
        return str(self.workers + self.standbys)

    def figures(self) -> acc.RowFigures:
        return acc.RowFigures(
            self.policy,
            self.mode,
            self.samples,
            self.wall,
            self.workers,
            self.standbys,
            self.strategy,
        )


def running_pods(core: Any, ns: str, custom: Any = None) -> list[Any]:
    """Every running pod of the job, standbys included: a spot reclaim does not know which pod
    trains, so each pod is preempted at the same rate (``acc.pick_victim``). ``custom`` is
    kept for the callers' signature."""
    return [
        p
        for p in core.list_namespaced_pod(ns).items
        if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
    ]


def storage_metrics(storage: Path) -> list[dict[str, Any]]:
    """The metrics of every committed checkpoint under ``storage`` (the checkpoint path or a
    run directory below it): the final checkpoint counts even when its ``commit`` event was
    never written (a stopped job's last ``report()`` raises after committing)."""
    from torchjob.checkpoint import CheckpointStorage

    found: list[dict[str, Any]] = []
    candidates = [storage, *(d for d in storage.rglob("*") if d.is_dir() and d.name[0] != ".")]
    for d in candidates:
        try:
            found.extend(dict(c.metrics) for c in CheckpointStorage(str(d)).list_committed())
        except Exception:  # not a checkpoint directory
            continue
    return found


def hard_kill(pod: Any) -> int:
    """SIGKILL every process of the pod's containers on this host (the real node's kubelet
    runs them here); returns how many were killed."""
    uid = pod.metadata.uid
    keys = (uid, uid.replace("-", "_"))
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if any(key in cgroup for key in keys) and b"python" in cmdline:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except OSError:
                continue
    return killed


def wait_step_after(events: Path, t: float, gen_above: int, timeout: float) -> dict[str, Any]:
    return k.wait_for(
        lambda: next(
            (
                e
                for e in read_events(events)
                if e["ev"] == "step" and e["t"] > t and e["gen"] > gen_above
            ),
            None,
        ),
        timeout,
        f"a step of a generation above {gen_above} in {events}",
        interval=0.2,
    )


def run_row(
    args: argparse.Namespace,
    cluster: k.Cluster,
    core: Any,
    custom: Any,
    policy: str,
    mode: str,
    evictions: int,
    duration: float,
    index: int,
    strategy: str = "ddp",
) -> Row:
    ns = f"goodput-{args.run_id}-{index}"
    row = Row(
        policy,
        mode,
        strategy,
        workers=args.replicas,
        standbys=args.standby if policy == "Standby" else 0,
    )
    core.create_namespace({"metadata": {"name": ns}})
    k.wait_for(lambda: has_default_sa(core, ns), 60, f"the default ServiceAccount in {ns}")
    base = Path(tempfile.mkdtemp(prefix=f"tj-goodput-{index}-"))
    base.chmod(0o777)
    storage = base / "checkpoints"
    storage.mkdir()
    storage.chmod(0o777)
    events = base / "events.jsonl"
    events.touch()
    events.chmod(0o666)
    watch = PodWatch(core, ns, custom if policy != KUBEFLOW else None)
    rng = random.Random(args.seed * 1000 + index)
    body = (
        kubeflow_manifest(args, storage, events)
        if policy == KUBEFLOW
        else manifest(args, policy, storage, events, strategy)
    )
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(body))
    try:
        first = k.wait_for(
            lambda: next((e for e in read_events(events) if e["ev"] == "step"), None),
            args.start_timeout,
            f"the first step of {policy}/{mode}/{strategy}",
            interval=0.2,
        )
    except k.WaitTimeout:
        # One row that never trains must not cost the others: say so in its line.
        log(
            f"{policy}/{mode}/{strategy}: no first step in {args.start_timeout:.0f}s; skipping the row"
        )
        row.note = f"never made a first step in {args.start_timeout:.0f}s"
        kind = "pytorchjobs" if policy == KUBEFLOW else "torchjobs"
        cluster.kubectl("-n", ns, "delete", kind, JOB, "--wait=false", check=False)
        watch.stop()
        core.delete_namespace(ns)
        return row
    t_first = first["t"]
    log(
        f"{policy}/{mode}/{strategy}: first step {t_first - min(watch.added.values(), default=t_first):.1f}s after the first pod"
    )
    trains = custom if policy != KUBEFLOW else None
    for i in range(evictions):
        time.sleep(max(0.0, args.mtbf * rng.uniform(0.8, 1.2)))
        pods = running_pods(core, ns, trains)
        if not pods:
            log("no running pod to preempt; waiting for one")
            k.wait_for(
                lambda: running_pods(core, ns, trains) or None, args.start_timeout, "a running pod"
            )
            pods = running_pods(core, ns, trains)
        victim = acc.pick_victim(pods, rng, name=lambda p: p.metadata.name)
        steps = [e for e in read_events(events) if e["ev"] == "step"]
        gen = max(e["gen"] for e in steps)
        rec = Recovery(time.time(), victim.metadata.name, gen, steps[-1]["step"])
        watch.note("kill" if mode == "hard" else "evict", pod=victim.metadata.name)
        if mode == "graceful":
            from kubernetes import client

            core.create_namespaced_pod_eviction(
                victim.metadata.name,
                ns,
                client.V1Eviction(metadata=client.V1ObjectMeta(name=victim.metadata.name)),
            )
        else:
            if hard_kill(victim) == 0:
                row.note = "hard: no process found on this host; force-deleted instead"
                core.delete_namespaced_pod(victim.metadata.name, ns, grace_period_seconds=0)
        known = set(watch.added)
        try:
            step = wait_step_after(events, rec.t_evict, gen, args.start_timeout)
        except k.WaitTimeout:
            log(
                f"{policy}/{mode}/{strategy}: eviction {i + 1} did not recover in {args.start_timeout}s"
            )
            row.recoveries.append(rec)
            break
        rec.first_step = step["t"]
        rank0_steps = [e["t"] for e in read_events(events) if e["ev"] == "step"]
        rec.pause = acc.longest_pause(rank0_steps, rec.t_evict, rec.first_step)
        new_gen = step["gen"]
        evs = [e for e in read_events(events) if e["gen"] == new_gen]
        restored = [e for e in evs if e["ev"] == "restored"]
        rec.resumed_step = min((e["step"] for e in restored), default=None)
        last_before = [
            e["step"] for e in read_events(events) if e["ev"] == "step" and e["gen"] < new_gen
        ]
        rec.step_before = max(last_before, default=rec.step_before)
        # Pods created for this recovery: after the eviction and before its first step (an
        # elastic job's replacement joins later, at a grow: it is not on this recovery's path).
        new_pods = [
            t
            for uid, t in watch.added.items()
            if (uid not in known or t > rec.t_evict) and t <= rec.first_step
        ]
        b = {"reaction": min(new_pods, default=rec.t_evict)}
        prev = b["reaction"]
        for name, ev in zip(PHASES[1:6], EVENT_ORDER, strict=True):
            ts = [e["t"] for e in evs if e["ev"] == ev]
            if ts:
                prev = max(prev, max(ts))
            b[name] = prev
        b["first step"] = max(prev, rec.first_step)
        rec.boundaries = b
        row.recoveries.append(rec)
        log(
            f"{policy}/{mode}/{strategy}: preemption {i + 1}/{evictions} of {rec.pod}: "
            f"first step of generation {new_gen} after {rec.seconds:.1f}s"
        )
    if duration > 0:
        time.sleep(max(0.0, t_first + duration - time.time()))
    else:
        time.sleep(args.mtbf)  # the last recovery's next interval counts too
    t_end = time.time()
    watch.note("window", t0=t_first, t1=t_end)  # the row's measured window, for the trace
    if policy == KUBEFLOW:
        # No restart budget to charge here: what torchrun restarted is the container restarts.
        row.restarts = sum(
            cs.restart_count
            for p in core.list_namespaced_pod(ns).items
            for cs in p.status.container_statuses or ()
        )
        row.disruptions = None
    else:
        status = (
            custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, JOB).get("status") or {}
        )
        row.restarts, row.disruptions = status.get("restarts", 0), status.get("disruptions", 0)
    save_logs(
        cluster,
        core,
        ns,
        args.out / f"{index:02d}-{policy}-{mode}-{strategy}-logs",
        ended=dict(watch.ended_logs),
    )
    if policy == KUBEFLOW:
        cluster.kubectl("-n", ns, "delete", "pytorchjob", JOB, "--wait=false")
    else:
        cluster.kubectl("-n", ns, "delete", "torchjobs", JOB, "--wait=false")
    k.wait_for(lambda: not core.list_namespaced_pod(ns).items, args.grace + 120, "pods gone")
    all_events = read_events(events)
    row.committed = acc.committed_samples(all_events, storage_metrics(storage))
    # Work the row trained but did not save counts as lost, except in a baseline (there the
    # larger count, the ideal rate's, is the conservative one).
    saved = None if mode == acc.BASELINE_MODE else row.committed
    row.samples = acc.window_samples(all_events, t_first, t_end, saved=saved)
    trained = acc.samples_at(all_events, t_end)
    if row.committed < trained:
        # The job's stop after the window did not save it all (counted as lost).
        unsaved = f"final checkpoint short: storage holds {row.committed} of {trained} samples"
        row.note = "; ".join(filter(None, (row.note, unsaved)))
        log(f"{policy}/{mode}/{strategy}: {unsaved} trained by the window's end")
    row.wall = t_end - t_first
    row.t_first = t_first
    steps = [e for e in all_events if e["ev"] == "step" and e["t"] <= t_end]
    row.step_times = [e["t"] for e in steps]
    row.step_samples = [float(e.get("world", args.replicas) * args.batch) for e in steps]
    watch.stop()
    row.pod_seconds = acc.pod_seconds(watch.lines(), t_first, t_end)
    # The row's raw material, kept beside its table: the workers' events and the trace.
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{index:02d}-{policy}-{mode}-{strategy}"
    copy_compressed(events, args.out / f"{stem}-events.jsonl.gz")
    watch.write(args.out / f"{stem}-trace.jsonl.gz")
    core.delete_namespace(ns)
    return row


def save_logs(
    cluster: k.Cluster, core: Any, ns: str, into: Path, ended: dict[str, str] | None = None
) -> None:
    """The logs of the pods left at a row's end (the last replacements among them), with the
    kubelet's timestamps: where a replacement's start went, line by line; and ``ended``, the
    logs of the pods whose containers ended during the row (``<pod>-<uid>.log``)."""
    into.mkdir(parents=True, exist_ok=True)
    for key, text in (ended or {}).items():
        (into / f"{key}.log").write_text(text)
    for pod in core.list_namespaced_pod(ns).items:
        name = pod.metadata.name
        done = cluster.kubectl(
            "-n", ns, "logs", "--timestamps", "--all-containers", name, check=False
        )
        (into / f"{name}.log").write_text(getattr(done, "stdout", "") or "")
