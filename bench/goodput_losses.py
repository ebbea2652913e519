"""How a goodput row takes a loss (bench/goodput_rows.py; issue 39), by ``--modes``:

- ``graceful``: a random running pod of the job evicted through the Eviction API;
- ``hard``: every process of a random running pod's container SIGKILLed on the host;
- ``vanish``: a random real node that runs at least one of the job's running pods and neither
  the operator nor a kube-system pod vanishes (hack/node.sh vanish: its link cut, every process
  frozen); it comes back ``--node-return`` seconds later (the fleet's new VM), in the
  background, so the capacity returns;
- ``notice30`` / ``notice120``: such a node gets a termination handler's notice (the taint
  now: GKE's for 30 s, AWS NTH's for 120 s, each the notice its cloud gives, so the operator
  knows the deadline from the key; a drain through the Eviction API 10 s before it goes,
  gone after 30 or 120 s), and comes back ``--node-return`` seconds after it went. Until
  2026-11-29i both used the AWS taint, and the operator took a 30 s notice for 120 s until
  the drain came.

With ``--spares`` (bench/goodput_fleet.py), a notice also launches the node's replacement, Ready
``--provision`` seconds later, as Karpenter does on a spot interruption warning; the noticed
node, once gone, comes back as a spare.

A loss never waits for the job: it is taken when the schedule says (``goodput_schedule``); a
draw that finds nothing to take then (no running pod; every eligible node already gone) is
held until something qualifies (``Losses.take_held``, at most ``goodput_schedule.HOLD_MEANS`` mean
intervals, then recorded as skipped), so both systems of a row meet the same losses. A node loss records every pod of the job that was on the node.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests import kube as k
from tests.cluster.realnode import NODE_LABEL

from bench import goodput_accounting as acc
from bench import goodput_schedule as sch
from bench.goodput_fleet import SPARE_TAINT, Fleet
from bench.goodput_pods import hard_kill, running_pods
from bench.goodput_records import Recovery
from bench.harness import logger

log = logger("goodput")
OPERATOR_NS = "torchjob-system"
INFRA_NAMESPACES = (OPERATOR_NS, "kube-system")
HOLD_POLL_S = 1.0
"""How often a held loss looks again for something to take (``Losses.take_held``)."""
NOTICE_DRAIN_BEFORE = 10
"""A notice's drain comes this many seconds before its node goes."""
LOGS_BEFORE_VANISH_S = 2.0
"""How long before a noticed node goes the logs of the job's pods still on it are read."""
NOTICE_PROVIDER = {30: "gke", 120: "aws"}
"""The termination handler whose notice a ``noticeN`` row gives (the taint's key says how long
the node has: ``torchjob_operator.common.nodes.DEFAULT_NOTICE_TAINTS``)."""
SYSTEM_TAINT = "bench.torchjob.io/system"
"""``--system-node``: the taint (NoSchedule) that keeps the job's pods off the operator's
node, as a cloud cluster's system node pool keeps them off its on-demand CPU nodes."""


def infra_nodes(core: Any) -> set[str]:
    """The nodes that run the operator or a kube-system pod: a node loss leaves them alone."""
    return {
        p.spec.node_name
        for ns in INFRA_NAMESPACES
        for p in core.list_namespaced_pod(ns).items
        if p.spec.node_name
    }


def reserve_system_node(core: Any) -> str:
    """Taint the node running the operator (``SYSTEM_TAINT``, NoSchedule: the operator stays,
    no new pod of a job goes there): the job's pods spread over the nodes a loss can take, as
    on a cloud cluster whose operators run on a system pool and whose GPU pods run on spot
    nodes. The node's name."""
    infra = sorted(infra_nodes(core))
    if len(infra) != 1:
        raise RuntimeError(f"--system-node: the infrastructure runs on {infra or 'no node'}, "
                           "not on one node")  # fmt: skip
    taints = [t for t in core.read_node(infra[0]).spec.taints or () if t.key != SYSTEM_TAINT]
    taints.append({"key": SYSTEM_TAINT, "value": "true", "effect": "NoSchedule"})
    core.patch_node(infra[0], {"spec": {"taints": taints}})
    return infra[0]


def release_system_node(core: Any, name: str) -> None:
    """Undo ``reserve_system_node`` (a kept cluster serves the tests afterwards)."""
    taints = [t for t in core.read_node(name).spec.taints or () if t.key != SYSTEM_TAINT]
    core.patch_node(name, {"spec": {"taints": taints}})


def job_pods_on(core: Any, ns: str, node: str) -> list[Any]:
    """The job's pods on ``node`` that are not being deleted (what the node takes with it)."""
    return sorted(
        (
            p
            for p in core.list_namespaced_pod(ns).items
            if p.spec.node_name == node
            and p.metadata.deletion_timestamp is None
            and p.status.phase in ("Pending", "Running")
        ),
        key=lambda p: p.metadata.name,
    )


def fleet_whole(core: Any, names: list[str]) -> bool:
    """Every real node Ready, schedulable and untainted (but for the real nodes' own taint,
    ``SYSTEM_TAINT`` and a spare's ``SPARE_TAINT``):
    a row starts on the whole fleet (a
    node a previous row lost returns without waiting, and a job placed while it is still
    NotReady would start with every pod on the others, so a node loss would take them all)."""
    for name in names:
        node = core.read_node(name)
        own = (NODE_LABEL, SYSTEM_TAINT, SPARE_TAINT)
        taints = [t for t in node.spec.taints or () if t.key not in own]
        if k.node_ready_status(core, name) != "True" or node.spec.unschedulable or taints:
            return False
    return True


def row_fleet(core: Any, names: list[str], spares: int, delay: float, watch: Any) -> Fleet | None:
    """The row's fleet with ``spares`` (``--spares``; bench/goodput_fleet.py), or None: every
    real node but the infrastructure's is a spot node. Every row taints its spares, so that
    each runs on the same number of spot nodes."""
    if spares <= 0:
        return None
    infra = infra_nodes(core)
    note = watch.note if watch is not None else (lambda what, **fields: None)
    return Fleet.for_row(core, [n for n in names if n not in infra], spares, delay, note)


def _said(node: str, output: str | None) -> None:
    """What hack/node.sh notice said it did (read to its end: its pipe never fills)."""
    lines = (output or "").strip().splitlines()
    log(f"notice of {node}: " + (" | ".join(lines[-3:]) or "(no output)"))


@dataclass
class Losses:
    """The losses of one row: takes them, and brings lost nodes back in the background."""

    core: Any
    ns: str
    mode: str
    rng: random.Random
    nodes: Any = None
    """The ``RealNode`` of the run (node modes)."""
    node_return: float = 60.0
    watch: Any = None
    thaw: bool = False
    """A node returns with its frozen processes (the same VM) instead of a new VM's none."""
    fleet: Fleet | None = None
    """``--spares``: each notice provisions a spare; a noticed node returns as one (a vanish
    row's spares stay idle: its node comes back itself, as without spares)."""
    gone: set[str] = field(default_factory=set)
    """Nodes taken and not yet back."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, gen_before: int, step_before: int) -> Recovery | None:
        """Take one loss now; the loss (its recovery not yet known), or None when there was
        nothing to take."""
        if self.mode in sch.NODE_MODES:
            return self._take_node(gen_before, step_before)
        pods = running_pods(self.core, self.ns)
        if not pods:
            return None
        victim = acc.pick_victim(pods, self.rng, name=lambda p: p.metadata.name)
        name = victim.metadata.name
        self._note("kill" if self.mode == "hard" else "evict", pod=name)
        rec = Recovery(time.time(), name, gen_before, step_before, pods=[name])
        if self.mode == "graceful":
            from kubernetes import client

            self.core.create_namespaced_pod_eviction(
                name, self.ns, client.V1Eviction(metadata=client.V1ObjectMeta(name=name))
            )
        elif hard_kill(victim) == 0:
            log(f"hard: no process of {name} found on this host; force-deleting it")
            self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
        return rec

    def take_held(self, where: Callable[[], tuple[int, int]], hold_s: float) -> Recovery | None:
        """Take one loss now, or as soon as something qualifies within ``hold_s`` (the wait is
        ``Recovery.held``); ``where()``: the job's generation and step at that moment."""
        drawn = time.time()
        while (rec := self.take(*where())) is None and time.time() - drawn < hold_s:
            time.sleep(HOLD_POLL_S)
        if rec is not None:
            rec.held = rec.t_evict - drawn
        return rec

    def _eligible(self) -> list[str]:
        with self._lock:
            gone = set(self.gone)
        infra = infra_nodes(self.core)
        names = {p.spec.node_name for p in running_pods(self.core, self.ns) if p.spec.node_name}
        return sorted(names - infra - gone)

    def _take_node(self, gen_before: int, step_before: int) -> Recovery | None:
        """A node loss: vanish now, or a notice whose node goes ``noticeN`` seconds later."""
        if self.nodes is None:
            raise RuntimeError(f"--modes {self.mode}: a node loss needs the real nodes")
        candidates = self._eligible()
        if not candidates:
            return None
        node = self.rng.choice(candidates)
        lost = job_pods_on(self.core, self.ns, node)
        pods = [p.metadata.name for p in lost]
        with self._lock:
            self.gone.add(node)
        notice = sch.notice_seconds(self.mode)
        if not notice and self.watch is not None:  # while its kubelet answers, before the
            self.watch.keep_logs_before_vanish(lost)  # loss's time is taken
        self._note(self.mode, node=node, pods=pods)
        rec = Recovery(time.time(), node, gen_before, step_before, node=node, pods=pods)
        if notice and self.fleet is not None:  # the new VM, launched on the notice
            self._threads.append(self.fleet.provision_after(node, self._stop))
        if notice:
            self._logs_before_vanish(node, notice - LOGS_BEFORE_VANISH_S)
            proc = self.nodes.notice(
                node,
                provider=NOTICE_PROVIDER.get(notice, "aws"),
                drain_after=max(0, notice - NOTICE_DRAIN_BEFORE),
                vanish_after=notice,
            )
            self._background(node, lambda: _said(node, proc.communicate()[0]), lost, self.fleet)
        else:
            try:
                self.nodes.vanish(node)
            except Exception as e:  # the row goes on: this draw took nothing
                log(f"vanish {node} failed: {e}")
                with self._lock:
                    self.gone.discard(node)
                return None
            self._background(node, lambda: None, lost, None)
        return rec

    def _logs_before_vanish(self, node: str, after_s: float) -> None:
        """``after_s`` from now, read the logs of the job's pods then on ``node`` (a noticed
        node, about to vanish): a pod still running there when it goes leaves no log."""
        if self.watch is None:
            return

        def read() -> None:
            time.sleep(max(0.0, after_s))
            with contextlib.suppress(Exception):  # the logs are extras: the row goes on
                self.watch.keep_logs_before_vanish(job_pods_on(self.core, self.ns, node))

        threading.Thread(target=read, name=f"logs-{node}", daemon=True).start()

    def _background(self, node: str, until_gone: Any, lost: list[Any], fleet: Any) -> None:
        """Bring ``node`` back ``node_return`` seconds after ``until_gone()`` returns: a new
        VM. Its VM gone, the node's pods give this machine's memory back at once
        (hack/node.sh reclaim: their processes SIGKILLed, the link still cut, its daemons
        still frozen): on a fleet a lost node's memory is its own, and here three frozen
        nodes of 8 trainers each ran the 24 GiB machine out (2026-12-07m). ``thaw`` keeps
        them (the same VM, resuming where it stopped). With a ``fleet`` (a notice row's
        spares) it comes back as a spare."""

        def back() -> None:
            until_gone()
            self._note("gone", node=node)
            reclaimed = False
            if not self.thaw:
                try:
                    self.nodes.reclaim(node)
                    self._note("reclaimed", node=node)
                    reclaimed = True
                except Exception as e:  # killed at its return instead
                    log(f"reclaim {node} failed: {e}")
            time.sleep(self.node_return)
            killed = 0 if self.thaw or reclaimed else sum(hard_kill(p) for p in lost)
            try:
                if fleet is not None:
                    fleet.retire(node)
                self.nodes.return_node(node, wait=False)
                spare = {"spare": True} if fleet is not None else {}
                self._note("returned", node=node, killed=killed, **spare)
                if fleet is not None:
                    fleet.back(node)
            except Exception as e:  # the row goes on; the next one finds the node missing
                log(f"node {node} did not return: {e}")
            with self._lock:
                self.gone.discard(node)

        thread = threading.Thread(target=back, name=f"return-{node}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, timeout: float = 600.0) -> list[str]:
        """Wait until every node taken is back; the nodes still gone after ``timeout``."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()  # a provision still waiting for a spare gives up with its row
        with self._lock:
            return sorted(self.gone)

    def return_all(self) -> None:
        """An interrupted row: every node taken comes back now."""
        self._stop.set()
        with self._lock:
            gone = sorted(self.gone)
        for node in gone:
            try:
                self.nodes.return_node(node, wait=False)
            except Exception as e:
                log(f"node {node} did not return: {e}")

    def _note(self, what: str, **fields: Any) -> None:
        if self.watch is not None:
            self.watch.note(what, **fields)


DISK_USED_MAX = 0.75
"""The most of ``/`` a run may start with in use: a row's containers write their own layers
and logs (the nodes share the images' files: hack/node-roots.sh), and past 85 % the kubelets' image garbage
collection removes images the rows need (2026-11-29g: the pause image went from two nodes
at 92 % and the rows after never started)."""


def disk_too_full(path: str = "/") -> str | None:
    """Why the run must not start for lack of disk, or None."""
    usage = shutil.disk_usage(path)
    used = usage.used / max(usage.used + usage.free, 1)
    if used <= DISK_USED_MAX:
        return None
    return (
        f"{path} is {used:.0%} in use ({usage.free / 2**30:.0f} GiB free): above "
        f"{DISK_USED_MAX:.0%} the real nodes' image garbage collection may remove the images "
        "the rows need. Free some first: `podman image prune -f`, the real nodes' state of "
        "earlier runs (/tmp/tj-goodput-*, with no cluster up), Go's build cache."
    )
