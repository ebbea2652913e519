"""One row of the goodput benchmark: a job started, its losses taken (bench/goodput_losses.py)
on a schedule drawn before the row (bench/goodput_schedule.py) or each one after the previous
recovery, each recovery resolved from the workers' events after the row, and what the row
trained in its window (bench/goodput_accounting.py counts it)."""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import kube as k

from bench import goodput_accounting as acc
from bench import goodput_schedule as sch
from bench.goodput_cpu import node_cgroups
from bench.goodput_jobs import JOB, KUBEFLOW, kubeflow_manifest, manifest
from bench.goodput_losses import OPERATOR_NS, Losses, fleet_whole, row_fleet
from bench.goodput_pods import save_logs
from bench.goodput_rates import full_size_rates
from bench.goodput_records import (
    EVENT_ORDER,
    PHASES,
    Recovery,
    Row,
    read_events,
    storage_metrics,
    wait_step_after,
)
from bench.goodput_watch import PodWatch
from bench.harness import copy_compressed, has_default_sa, logger
from torchjob.api.models import GROUP, PLURAL, VERSION

log = logger("goodput")
__all__ = ["Recovery", "Row", "log", "read_events", "run_row", "storage_metrics", "wait_step_after"]


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


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
    restore_point: bool | None = None,
    repeat: int = 0,
) -> Row:
    """One row: ``evictions`` losses of ``mode`` (none for a baseline, which runs ``duration``
    seconds from its first step); ``restore_point`` overrides ``--restore-point``. Every
    system's row of one mode in one repeat draws the same loss times (seed, repeat, mode)."""
    rp = args.restore_point if restore_point is None else restore_point
    run = _RowRun.start(args, cluster, core, custom, policy, mode, index, strategy, rp, repeat)
    t_first = run.first_step()
    if t_first is None:
        return run.row
    try:
        if duration > 0 or evictions == 0:
            _sleep_until(t_first + (duration or args.mtbf))
        elif args.schedule == "poisson":
            run.poisson(t_first, evictions)
        else:
            for i in range(evictions):
                if not run.preempt(t_first, i, evictions):
                    break
            time.sleep(run.mtbf)  # the last recovery's next interval counts too
    except KeyboardInterrupt:
        run.losses.return_all()
        raise
    try:
        run.finish(t_first, time.time())
    except BaseException:
        # A row that fails to finish leaves no job training beside the next rows (a Kubeflow job
        # outlives its controller: 2026-11-29g run 2's baselines shared the CPUs with one).
        core.delete_namespace(run.ns)
        raise
    return run.row


@dataclass
class _RowRun:
    """One row while it runs: its job in its own namespace, the workers' events file, the
    checkpoint storage, the pod watch, the random source of its losses and what takes them."""

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
    losses: Losses

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
        restore_point: bool = False,
        repeat: int = 0,
    ) -> _RowRun:
        """Create the row's namespace, storage and events file, and apply its job."""
        ns = f"goodput-{args.run_id}-{index}"
        row = Row(
            policy,
            mode,
            strategy,
            workers=args.replicas,
            standbys=args.standby if policy == "Standby" else 0,
            restore_point=restore_point and policy != KUBEFLOW,
            index=index,
            suffix="-norp" if restore_point != args.restore_point else "",
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
        nodes = getattr(args, "nodes", None)
        cpu = node_cgroups(nodes.names, cluster.kubeconfig.parent.name) if nodes else None
        watch = PodWatch(core, ns, custom if policy != KUBEFLOW else None, cpu)
        rng = random.Random(f"{args.seed}/{repeat}/{mode}")  # the same draw for every system
        body = (
            kubeflow_manifest(args, storage, events)
            if policy == KUBEFLOW
            else manifest(args, policy, storage, events, strategy, restore_point=restore_point)
        )
        fleet = None
        if nodes is not None:
            k.wait_for(lambda: fleet_whole(core, nodes.names), 600, "every real node back, Ready")
            fleet = row_fleet(core, nodes.names, args.spares, args.provision, watch)
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(body))
        losses = Losses(core, ns, mode, rng, nodes, args.node_return, watch, args.thaw, fleet)
        return cls(args, cluster, core, custom, index, ns, storage, events, watch, rng, row, losses)

    @property
    def label(self) -> str:
        rp = " (no restore point)" if self.row.suffix else ""
        return f"{self.row.policy}/{self.row.mode}/{self.row.strategy}{rp}"

    @property
    def mtbf(self) -> float:  # this row's stated mean interval (--mtbf, --node-mtbf)
        return sch.mean_interval(self.row.mode, self.args.mtbf, self.args.node_mtbf)

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

    def _loss(self, t_first: float, i: int, n: int, hold_s: float = 0.0) -> Recovery | None:
        """Take loss ``i`` of ``n`` now, whatever the job is doing, or as soon as there is
        something to take within ``hold_s``; None (and the draw listed as skipped) when
        there was nothing to take by then."""

        def where() -> tuple[int, int]:  # rank 0's generation and step now
            steps = sch.rank0_steps(read_events(self.events))
            return (int(steps[-1]["gen"]), int(steps[-1]["step"])) if steps else (-1, 0)

        drawn = time.time()
        rec = self.losses.take_held(where, hold_s)
        if rec is None:
            what = "no running pod" if self.row.mode in sch.POD_MODES else "no node to take"
            skipped = f"loss {i + 1} at +{drawn - t_first:.1f}s: {what} within {hold_s:.0f}s"
            self.row.skipped.append(skipped)
            log(f"{self.label}: {skipped}")
            return None
        self.row.recoveries.append(rec)
        held = f" (held {rec.held:.0f}s for something to take)" if rec.held >= 1 else ""
        log(f"{self.label}: loss {i + 1}/{n}: {rec.describe(t_first)}{held}")
        return rec

    def poisson(self, t_first: float, evictions: int) -> None:
        """The Poisson schedule: every loss time drawn before the first is taken, each loss
        taken at its time, and the row ends a mean interval after the last node is gone.

        A loss that finds nothing to take at its time (the job's pods down, or only on nodes
        taken) is held until something qualifies, up to ``goodput_schedule.HOLD_MEANS`` mean intervals; the
        later losses keep their drawn times. Without the hold, the system down longer met
        fewer losses (2026-11-30q notice120-2: Kubeflow 7, torchjob 9)."""
        offsets = sch.poisson_times(self.rng, self.mtbf, evictions)
        self.watch.note("schedule", t0=t_first, offsets=offsets)
        log(f"{self.label}: losses at +" + ", +".join(f"{o:.0f}" for o in offsets) + " s")
        last = None
        for i, offset in enumerate(offsets):
            _sleep_until(t_first + offset)
            rec = self._loss(t_first, i, evictions, hold_s=sch.HOLD_MEANS * self.mtbf)
            last = rec.t_evict if rec is not None else last
        notice = sch.notice_seconds(self.row.mode)
        end = sch.end_of_row(t_first, offsets, self.mtbf, notice)
        _sleep_until(max(end, (last or 0.0) + notice + self.mtbf))

    def preempt(self, t_first: float, i: int, evictions: int) -> bool:
        """``--schedule after-recovery``: loss ``i`` a mean interval (+-20 %) after the previous
        recovery, then wait for its recovery; False when the job did not recover in
        ``--start-timeout`` (the row ends its losses there)."""
        time.sleep(max(0.0, self.mtbf * self.rng.uniform(0.8, 1.2)))
        rec = self._loss(t_first, i, evictions)
        if rec is None:
            return True
        try:
            wait_step_after(self.events, rec.t_evict, rec.gen_before, self.args.start_timeout)
        except k.WaitTimeout:
            log(f"{self.label}: loss {i + 1} did not recover in {self.args.start_timeout}s")
            return False
        return True

    def _resolve(self, events: list[dict[str, Any]]) -> None:
        """Each loss's recovery from the events, after the row (overlapping losses too:
        ``sch.attribute``), and the phases of each recovered one."""
        recs = self.row.recoveries
        found = sch.attribute([r.t_evict for r in recs], events, self.args.start_timeout)
        trace = self.watch.lines()
        for rec, a in zip(recs, found, strict=True):
            rec.gen_before = a.gen_before
            members = sch.members_at(trace, rec.t_evict, JOB)
            if members is not None:
                rec.members_lost = len(members & set(rec.pods))
            if rec.trained_on:
                log(f"{self.label}: took no member, the job trained on: {rec.describe(self.row.t_first)}")  # fmt: skip
                continue
            if a.step is None:
                log(f"{self.label}: not recovered: {rec.describe(self.row.t_first)}")
                continue
            self._time(rec, a.step, events)

    def _time(self, rec: Recovery, step: Any, events: list[dict[str, Any]]) -> None:
        """Fill in ``rec`` from the events: its first step, pause, resumed step and the
        boundaries of its phases (``PHASES``)."""
        rec.first_step = float(step["t"])
        rank0_steps = [e["t"] for e in events if e["ev"] == "step"]
        rec.pause = acc.longest_pause(rank0_steps, rec.t_evict, rec.first_step)
        new_gen = rec.new_gen = int(step["gen"])
        evs = [e for e in events if e["gen"] == new_gen]
        restored = [e for e in evs if e["ev"] == "restored"]
        rec.resumed_step = min((e["step"] for e in restored), default=None)
        last_before = [
            e["step"]
            for e in events
            if e["ev"] == "step" and e["gen"] < new_gen and e["t"] <= rec.first_step
        ]
        rec.step_before = max(last_before, default=rec.step_before)
        # Pods created for this recovery: after the loss and before its first step (an
        # elastic job's replacement joins later, at a grow: it is not on this recovery's path).
        new_pods = [t for t in self.watch.added.values() if rec.t_evict < t <= rec.first_step]
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
        """End the row's window at ``t_end``: bring its lost nodes back, count its restarts,
        keep its logs, delete its job, account what it trained, resolve each loss's recovery,
        and keep its raw events and trace beside the table."""
        args, row, watch, ns = self.args, self.row, self.watch, self.ns
        stem = f"{self.index:02d}-{row.policy}-{row.mode}-{row.strategy}{row.suffix}"
        watch.note("window", t0=t_first, t1=t_end)  # the row's measured window, for the trace
        still_gone = self.losses.join(args.node_return + 300)  # kubectl logs needs the nodes
        if still_gone:
            log(f"{self.label}: nodes still gone at the row's end: {', '.join(still_gone)}")
        self._count_restarts()
        try:
            save_logs(
                self.cluster, self.core, ns, args.out / f"{stem}-logs", ended=dict(watch.ended_logs)
            )
        except Exception as e:  # the logs are the row's extras: its job must go all the same
            log(f"{self.label}: logs not saved: {e!r}")
        if not self.kubeflow:
            self._operator_log(args.out / f"{stem}-operator.log.gz")
        kind = "pytorchjob" if self.kubeflow else "torchjobs"
        self.cluster.kubectl("-n", ns, "delete", kind, JOB, "--wait=false")
        try:
            k.wait_for(
                lambda: not self.core.list_namespaced_pod(ns).items, args.grace + 120, "pods gone"
            )
        except k.WaitTimeout:
            log(f"{self.label}: pods left {args.grace + 120}s after the job's deletion; forced")
            for p in self.core.list_namespaced_pod(ns).items:
                self.core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
        self._account(t_first, t_end)
        watch.note("storage", committed=self.row.committed)  # for goodput_recompute.py's cap
        self._resolve(read_events(self.events))
        watch.stop()
        row.pod_seconds = acc.pod_seconds(watch.lines(), t_first, t_end)
        # The row's raw material, kept beside its table: the workers' events and the trace.
        args.out.mkdir(parents=True, exist_ok=True)
        copy_compressed(self.events, args.out / f"{stem}-events.jsonl.gz")
        watch.write(args.out / f"{stem}-trace.jsonl.gz")
        self.core.delete_namespace(ns)
        # Its checkpoints (2 GiB of them at 256 MiB of state) are counted: 17 rows' worth
        # filled the disk past the real nodes' image garbage-collection threshold.
        shutil.rmtree(self.storage.parent, ignore_errors=True)

    def _operator_log(self, path: Path) -> None:
        """The operator's log so far (the bench uninstalls it after its rows): what it
        decided, and when, beside the row's trace."""
        got = self.cluster.kubectl(
            "-n", OPERATOR_NS, "logs", "deploy/torchjob-operator", "--timestamps", check=False
        )
        if got.returncode != 0:
            log(f"{self.label}: operator log not saved: {got.stderr.strip()[:200]}")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(got.stdout.encode()))

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
        row.wall, row.t_first = t_end - t_first, t_first
        steps = [e for e in all_events if e["ev"] == "step" and e["t"] <= t_end]
        row.redone = acc.steps_redone(e["step"] for e in steps if e["t"] >= t_first)
        row.step_times = [e["t"] for e in steps]
        row.step_samples = [
            float(e.get("world", self.args.replicas) * self.args.batch) for e in steps
        ]
        row.gen_rates = full_size_rates(steps, self.args.replicas)
