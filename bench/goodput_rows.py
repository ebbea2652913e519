"""One row of the goodput benchmark: a job started, a storm of preemptions (graceful evictions
or SIGKILLs on the node), each recovery timed from the workers' events, and what the row
trained in its window (bench/goodput_accounting.py counts it)."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import kube as k

from bench import goodput_accounting as acc
from bench.goodput_jobs import JOB, KUBEFLOW, kubeflow_manifest, manifest
from bench.goodput_pods import hard_kill, running_pods, save_logs
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
    run = _RowRun.start(args, cluster, core, custom, policy, mode, index, strategy)
    t_first = run.first_step()
    if t_first is None:
        return run.row
    for i in range(evictions):
        if not run.preempt(i, evictions):
            break
    if duration > 0:
        time.sleep(max(0.0, t_first + duration - time.time()))
    else:
        time.sleep(args.mtbf)  # the last recovery's next interval counts too
    run.finish(t_first, time.time())
    return run.row


@dataclass
class _RowRun:
    """One row while it runs: its job in its own namespace, the workers' events file, the
    checkpoint storage, the pod watch, and the random source of its preemptions."""

    args: argparse.Namespace
    cluster: k.Cluster
    core: Any
    custom: Any
    index: int
    ns: str
    storage: Path
    events: Path
    watch: PodWatch
    rng: random.Random
    row: Row

    @classmethod
    def start(
        cls,
        args: argparse.Namespace,
        cluster: k.Cluster,
        core: Any,
        custom: Any,
        policy: str,
        mode: str,
        index: int,
        strategy: str,
    ) -> _RowRun:
        """Create the row's namespace, storage and events file, and apply its job."""
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
        return cls(args, cluster, core, custom, index, ns, storage, events, watch, rng, row)

    @property
    def label(self) -> str:
        return f"{self.row.policy}/{self.row.mode}/{self.row.strategy}"

    @property
    def kubeflow(self) -> bool:
        return self.row.policy == KUBEFLOW

    def first_step(self) -> float | None:
        """When the job made its first step; None (and the row skipped, its job and
        namespace deleted) when it made none in ``--start-timeout``."""
        args = self.args
        try:
            first = k.wait_for(
                lambda: next((e for e in read_events(self.events) if e["ev"] == "step"), None),
                args.start_timeout,
                f"the first step of {self.label}",
                interval=0.2,
            )
        except k.WaitTimeout:
            # One row that never trains must not cost the others: say so in its line.
            log(f"{self.label}: no first step in {args.start_timeout:.0f}s; skipping the row")
            self.row.note = f"never made a first step in {args.start_timeout:.0f}s"
            kind = "pytorchjobs" if self.kubeflow else "torchjobs"
            self.cluster.kubectl("-n", self.ns, "delete", kind, JOB, "--wait=false", check=False)
            self.watch.stop()
            self.core.delete_namespace(self.ns)
            return None
        t_first = float(first["t"])
        added = min(self.watch.added.values(), default=t_first)
        log(f"{self.label}: first step {t_first - added:.1f}s after the first pod")
        return t_first

    def _victim(self) -> Any:
        """A running pod, drawn at random after the mean time between failures."""
        args, core, ns = self.args, self.core, self.ns
        trains = self.custom if not self.kubeflow else None
        time.sleep(max(0.0, args.mtbf * self.rng.uniform(0.8, 1.2)))
        pods = running_pods(core, ns, trains)
        if not pods:
            log("no running pod to preempt; waiting for one")
            k.wait_for(
                lambda: running_pods(core, ns, trains) or None, args.start_timeout, "a running pod"
            )
            pods = running_pods(core, ns, trains)
        return acc.pick_victim(pods, self.rng, name=lambda p: p.metadata.name)

    def _take(self, victim: Any) -> None:
        """Evict the victim (graceful) or SIGKILL its processes (hard)."""
        name = victim.metadata.name
        self.watch.note("kill" if self.row.mode == "hard" else "evict", pod=name)
        if self.row.mode == "graceful":
            from kubernetes import client

            self.core.create_namespaced_pod_eviction(
                name, self.ns, client.V1Eviction(metadata=client.V1ObjectMeta(name=name))
            )
        elif hard_kill(victim) == 0:
            self.row.note = "hard: no process found on this host; force-deleted instead"
            self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)

    def preempt(self, i: int, evictions: int) -> bool:
        """Preemption ``i``, timed until the first step after it; False when the job did not
        recover in ``--start-timeout`` (the row ends its preemptions there)."""
        victim = self._victim()
        steps = [e for e in read_events(self.events) if e["ev"] == "step"]
        gen = max(e["gen"] for e in steps)
        rec = Recovery(time.time(), victim.metadata.name, gen, steps[-1]["step"])
        self._take(victim)
        known = set(self.watch.added)
        try:
            step = wait_step_after(self.events, rec.t_evict, gen, self.args.start_timeout)
        except k.WaitTimeout:
            log(f"{self.label}: eviction {i + 1} did not recover in {self.args.start_timeout}s")
            self.row.recoveries.append(rec)
            return False
        self._time(rec, step, known)
        self.row.recoveries.append(rec)
        log(
            f"{self.label}: preemption {i + 1}/{evictions} of {rec.pod}: "
            f"first step of generation {step['gen']} after {rec.seconds:.1f}s"
        )
        return True

    def _time(self, rec: Recovery, step: dict[str, Any], known: set[str]) -> None:
        """Fill in ``rec`` from the events: its first step, pause, resumed step and the
        boundaries of its phases (``PHASES``)."""
        rec.first_step = step["t"]
        rank0_steps = [e["t"] for e in read_events(self.events) if e["ev"] == "step"]
        rec.pause = acc.longest_pause(rank0_steps, rec.t_evict, rec.first_step)
        new_gen = step["gen"]
        evs = [e for e in read_events(self.events) if e["gen"] == new_gen]
        restored = [e for e in evs if e["ev"] == "restored"]
        rec.resumed_step = min((e["step"] for e in restored), default=None)
        last_before = [
            e["step"] for e in read_events(self.events) if e["ev"] == "step" and e["gen"] < new_gen
        ]
        rec.step_before = max(last_before, default=rec.step_before)
        # Pods created for this recovery: after the eviction and before its first step (an
        # elastic job's replacement joins later, at a grow: it is not on this recovery's path).
        new_pods = [
            t
            for uid, t in self.watch.added.items()
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

    def _count_restarts(self) -> None:
        row, ns = self.row, self.ns
        if self.kubeflow:
            # No restart budget to charge here: what torchrun restarted is the container restarts.
            row.restarts = sum(
                cs.restart_count
                for p in self.core.list_namespaced_pod(ns).items
                for cs in p.status.container_statuses or ()
            )
            row.disruptions = None
        else:
            job = self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, JOB)
            status = job.get("status") or {}
            row.restarts, row.disruptions = status.get("restarts", 0), status.get("disruptions", 0)

    def finish(self, t_first: float, t_end: float) -> None:
        """End the row's window at ``t_end``: count its restarts, keep its logs, delete its
        job, account what it trained, and keep its raw events and trace beside the table."""
        args, row, watch, ns = self.args, self.row, self.watch, self.ns
        stem = f"{self.index:02d}-{row.policy}-{row.mode}-{row.strategy}"
        watch.note("window", t0=t_first, t1=t_end)  # the row's measured window, for the trace
        self._count_restarts()
        save_logs(
            self.cluster, self.core, ns, args.out / f"{stem}-logs", ended=dict(watch.ended_logs)
        )
        kind = "pytorchjob" if self.kubeflow else "torchjobs"
        self.cluster.kubectl("-n", ns, "delete", kind, JOB, "--wait=false")
        k.wait_for(
            lambda: not self.core.list_namespaced_pod(ns).items, args.grace + 120, "pods gone"
        )
        self._account(t_first, t_end)
        watch.stop()
        row.pod_seconds = acc.pod_seconds(watch.lines(), t_first, t_end)
        # The row's raw material, kept beside its table: the workers' events and the trace.
        args.out.mkdir(parents=True, exist_ok=True)
        copy_compressed(self.events, args.out / f"{stem}-events.jsonl.gz")
        watch.write(args.out / f"{stem}-trace.jsonl.gz")
        self.core.delete_namespace(ns)

    def _account(self, t_first: float, t_end: float) -> None:
        """What the row trained in its window, what storage holds, and its step timeline."""
        row = self.row
        all_events = read_events(self.events)
        row.committed = acc.committed_samples(all_events, storage_metrics(self.storage))
        # Work the row trained but did not save counts as lost, except in a baseline (there the
        # larger count, the ideal rate's, is the conservative one).
        saved = None if row.mode == acc.BASELINE_MODE else row.committed
        row.samples = acc.window_samples(all_events, t_first, t_end, saved=saved)
        trained = acc.samples_at(all_events, t_end)
        if row.committed < trained:
            # The job's stop after the window did not save it all (counted as lost).
            unsaved = f"final checkpoint short: storage holds {row.committed} of {trained} samples"
            row.note = "; ".join(filter(None, (row.note, unsaved)))
            log(f"{self.label}: {unsaved} trained by the window's end")
        row.wall = t_end - t_first
        row.t_first = t_first
        steps = [e for e in all_events if e["ev"] == "step" and e["t"] <= t_end]
        row.step_times = [e["t"] for e in steps]
        row.step_samples = [
            float(e.get("world", self.args.replicas) * self.args.batch) for e in steps
        ]
