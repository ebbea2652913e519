"""Goodput under preemption: what a preemption costs a TorchJob, on the project's real node.

The real node (kubelet + containerd, hack/node.sh), the operator installed by the Helm chart
(tests/cluster/realnode.py), and one TorchJob per row running bench/_goodput_worker.py:
fixed-cost steps written the way docs/runtime.md tells users to write a loop (a checkpoint
every ``--ckpt-every`` steps and on ``should_stop()``). A preemption storm hits a random
running worker pod every ``--mtbf`` seconds (+-20 % jitter, seeded), ``--evictions`` times:

- ``graceful``: the Eviction API, the pod's own ``terminationGracePeriodSeconds`` (``--grace``);
- ``hard``: every process of the container killed with SIGKILL on the node (a node that
  vanishes: no SIGTERM, nothing saved), found through the pod UID in their cgroup.

Per policy (``RecreateGroup``, ``KeepSurvivors``, ``Elastic`` = KeepSurvivors with
``elastic.minReplicas = replicas - 1``, ``Standby`` = that with ``elastic.standbyReplicas``
(``--standby``, default 1) and ``shrinkOnDisruption``) and per mode it prints (the storm hits
every running pod of the job, standbys included, each at the same rate):

- goodput: the samples trained in the row's window / (ideal rate x the same wall time), the
  median [min-max] over ``--repeats`` runs. Each system's ideal rate (torchjob's, and
  Kubeflow's when it runs) is measured in the same invocation by its own row without
  evictions (same job, full size): its samples over its wall time, counted the same way. The
  window (the wall time) runs from the job's first step to the end of the row, when the bench
  deletes the job; the samples are the lineage's at the window's end less those at its start,
  from rank 0's step events (``acc.window_samples``: what a restore after the window threw
  away does not count). What the job trains after the window does not count either: an
  elastic pod drains ~20 s after the deletion before its final checkpoint. Storage's latest
  committed checkpoint after the row caps it (work trained but never saved counts as lost,
  in every row but the baselines), and a row whose work was not all saved says so in its line. The pure accounting is bench/goodput_accounting.py;
- goodput per pod paid: goodput x workers / (workers + standbys), and the pod count;
- goodput per pod-second paid, measured: goodput x workers x wall / the pod-seconds the row's
  trace shows over the same window (``acc.pod_seconds``: a pod is paid from the kubelet
  having it until it is gone or terminated, so an evicted pod's grace period and a
  replacement created ahead of its predecessor's end are both charged);
- a timeline per row (``--out``, SVG): rank 0's steps/s over time, each eviction marked;
- recovery p50/p95: eviction -> the first step of the new membership (rank 0's step event);
- lost steps: steps done before an eviction that the next membership did not resume from;
- restarts charged (``status.restarts``) and disruptions (``status.disruptions``);
- the median time in each phase of a recovery: operator reaction (eviction -> the first new pod
  exists; 0 when no pod is created before the recovery's first step, as when an elastic job
  goes on smaller), pod start (-> the slowest process of the new generation
  runs its first line), imports (-> torch and torchjob.train imported), group (-> inside the
  training function), DDP (-> ``prepare_model`` returned), restore (-> checkpoint loaded) and
  first step.

    python bench/goodput.py [--mtbf 60] [--grace 30] [--evictions 10] [--replicas 2]
                            [--policies RecreateGroup,KeepSurvivors,Elastic,Standby,Kubeflow]
                            [--modes graceful,hard] [--seed 0] [--keep-cluster]
    make bench-goodput            # the defaults: well over an hour for all eight rows

``Kubeflow`` is what a user would pick instead: Kubeflow's PyTorchJob v1.8.1 with
``elasticPolicy`` under torchrun (``kubeflow_manifest``), the training-operator built and run
as in bench/operator_vs_kubeflow.py, the same node, evictions and loop
(bench/_goodput_torchrun.py).

It asserts nothing and never runs in ``make test``. The figures depend on the machine: on a
shared, loaded machine compare the rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import kube as k  # noqa: E402
from tests.cluster.realnode import (  # noqa: E402
    NODE_LABEL,
    TOLERATION,
    HelmOperator,
    RealNode,
    image,
)

from torchjob.api.models import GROUP, PLURAL, VERSION  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
import goodput_accounting as acc  # noqa: E402

WORKER = REPO / "bench" / "_goodput_worker.py"
WORKERS = {"ddp": WORKER, "fsdp": REPO / "bench" / "_goodput_fsdp_worker.py"}
STRATEGIES = tuple(WORKERS)
TORCHRUN_WORKER = REPO / "bench" / "_goodput_torchrun.py"
KUBEFLOW = "Kubeflow"
POLICIES = ("RecreateGroup", "KeepSurvivors", "Elastic", "Standby", KUBEFLOW)
OPERATOR_NS = "torchjob-system"
JOB = "gp"
PHASES = ("reaction", "pod start", "imports", "group", "DDP", "restore", "first step")
EVENT_ORDER = ("start", "imported", "group", "model", "restored")


def log(msg: str) -> None:
    print(f"[goodput {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the job


def manifest(
    args: argparse.Namespace, policy: str, storage: Path, events: Path, strategy: str = "ddp"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": args.replicas,
        "backend": "gloo",
        "membershipPolicy": "RecreateGroup" if policy == "RecreateGroup" else "KeepSurvivors",
        "checkpoint": {"path": str(storage)},
        "failurePolicy": {"maxRestarts": 1000, "backoff": {"initialSeconds": 1, "maxSeconds": 1}},
        "template": {
            "spec": {
                "nodeSelector": {NODE_LABEL: "true"},
                "tolerations": [TOLERATION],
                "terminationGracePeriodSeconds": args.grace,
                "containers": [
                    {
                        "name": "trainer",
                        "image": image("runtime-cpu"),
                        "imagePullPolicy": "Never",
                        "command": [
                            "python3",
                            str(WORKERS[strategy]),
                            str(events),
                            str(args.step_seconds),
                            str(args.ckpt_every),
                            str(10**9),
                            str(args.batch),
                            *(["--restore-point"] if args.restore_point else []),
                        ],
                        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
                        "resources": {
                            "requests": {"cpu": args.cpu_request, "memory": args.memory_request}
                        },
                        "volumeMounts": [
                            {"name": "bench", "mountPath": str(WORKER.parent), "readOnly": True},
                            {"name": "storage", "mountPath": str(storage.parent)},
                        ],
                    }
                ],
                "volumes": [
                    {
                        "name": "bench",
                        "hostPath": {"path": str(WORKER.parent), "type": "Directory"},
                    },
                    {
                        "name": "storage",
                        "hostPath": {"path": str(storage.parent), "type": "Directory"},
                    },
                ],
            }
        },
    }
    if policy == "Elastic":
        spec["elastic"] = {
            "minReplicas": args.min_replicas,
            "maxReplicas": args.replicas,
            "shrinkOnDisruption": args.shrink_on_disruption,
        }
    if policy == "Standby":
        # Warm standbys take a lost pod's place at once; without a ready one, go on smaller.
        spec["elastic"] = {
            "minReplicas": args.min_replicas,
            "maxReplicas": args.replicas,
            "standbyReplicas": args.standby,
            "shrinkOnDisruption": True,
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchJob",
        "metadata": {"name": JOB},
        "spec": spec,
    }


KF_RDZV_PORT = 23456


def kubeflow_manifest(args: argparse.Namespace, storage: Path, events: Path) -> dict[str, Any]:
    """What a user would pick instead: Kubeflow's PyTorchJob v1.8.1, Workers only, with
    ``elasticPolicy`` (c10d rendezvous on worker-0, ``minReplicas = replicas - 1``) under
    torchrun, ``restartPolicy: OnFailure`` as Kubeflow's elastic example has it; the same
    node, image, grace period, steps and checkpoint cadence (bench/_goodput_torchrun.py)."""
    torchjob_spec = manifest(args, "RecreateGroup", storage, events)["spec"]["template"]
    template = json.loads(json.dumps(torchjob_spec))
    container = template["spec"]["containers"][0]
    container["name"] = "pytorch"  # the container Kubeflow looks for
    container["command"] = [
        "python3",
        str(TORCHRUN_WORKER),
        "--torchrun",  # torchrun, with the one default this image's torch needs (see there)
        str(TORCHRUN_WORKER),
        *(a for a in container["command"][2:] if a != "--restore-point"),
    ]
    container["env"] = [*container["env"], {"name": "USE_LIBUV", "value": "0"}]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": KF_RDZV_PORT}]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": JOB},
        "spec": {
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "minReplicas": args.min_replicas,
                "maxReplicas": args.replicas,
                "maxRestarts": 1000,
                "nProcPerNode": 1,
            },
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": args.replicas,
                    "restartPolicy": "OnFailure",
                    "template": template,
                }
            },
        },
    }


def read_events(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def pod_summary(pod: Any) -> dict[str, Any]:
    """What a trace line says of a pod: its phase, readiness, and each container's state."""
    status = pod.status
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
    states = []
    for cs in status.container_statuses or ():
        if cs.state.terminated is not None:
            states.append(f"terminated:{cs.state.terminated.exit_code}")
        elif cs.state.running is not None:
            states.append("running")
        else:
            states.append("waiting")
    return {
        "phase": status.phase,
        "ready": ready,
        "containers": states,
        "deleting": pod.metadata.deletion_timestamp is not None,
    }


class PodWatch:
    """Wall-clock times at which pods of the job appear (watch ADDED), by UID, and a trace of
    what the control plane said when: each pod's phase, readiness and container states as
    they change (and a ``pod-gone`` line when one is deleted), and each generation the
    TorchJob's status publishes. ``goodput_profile.py`` puts it beside the workers' events, so
    a recovery splits into what Kubernetes took (the kubelet's report of a dead container, the
    operator's decision) and what the runtime took; ``acc.pod_seconds`` reads the pods paid."""

    def __init__(self, core: Any, ns: str, custom: Any = None) -> None:
        self.core, self.ns, self.custom = core, ns, custom
        self.added: dict[str, float] = {}
        self.trace: list[dict[str, Any]] = []
        self._last: dict[str, dict[str, Any]] = {}
        self.ended_logs: dict[str, str] = {}
        """The log of each pod whose containers ended during the row, by ``<pod>-<uid>``: a
        pod replaced mid-row is gone by the row's end (``save_logs`` keeps these too)."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True)]
        if custom is not None:
            self._threads.append(threading.Thread(target=self._run_job, daemon=True))
        for t in self._threads:
            t.start()

    def note(self, what: str, **fields: Any) -> None:
        with self._lock:
            self.trace.append({"t": time.time(), "what": what, **fields})

    def _run(self) -> None:
        from kubernetes import watch

        # Each 30 s stream resumes at the last one's resourceVersion, so that a pod deleted
        # between two streams still has its DELETED event (a fresh list would not say so).
        rv: str | None = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                since = {"resource_version": rv} if rv else {}
                for ev in w.stream(
                    self.core.list_namespaced_pod, self.ns, timeout_seconds=30, **since
                ):
                    pod = ev["object"]
                    uid = pod.metadata.uid
                    if ev["type"] == "DELETED":
                        self._last.pop(uid, None)
                        self.note("pod-gone", pod=pod.metadata.name, uid=uid)
                    else:
                        self.added.setdefault(uid, time.time())
                        summary = pod_summary(pod)
                        if self._last.get(uid) != summary:
                            self._last[uid] = summary
                            self.note("pod", pod=pod.metadata.name, uid=uid, **summary)
                            ended = summary["containers"] and all(
                                c.startswith("terminated") for c in summary["containers"]
                            )
                            if ended:
                                self._keep_log(pod.metadata.name, uid)
                    if self._stop.is_set():
                        break
                rv = w.resource_version
            except Exception:  # a dropped watch is resumed (from a fresh list)
                rv = None
                time.sleep(0.2)

    def _keep_log(self, name: str, uid: str) -> None:
        """Read an ended pod's log now, beside the watch (the pod may go any moment)."""

        def read() -> None:
            try:
                text = self.core.read_namespaced_pod_log(name, self.ns, timestamps=True)
            except Exception as exc:  # gone already: say so in its place
                text = f"(log not read: {exc})"
            with self._lock:
                self.ended_logs[f"{name}-{uid[:8]}"] = text

        threading.Thread(target=read, daemon=True).start()

    def _run_job(self) -> None:
        from kubernetes import watch

        seen: tuple[Any, ...] | None = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.ns,
                    PLURAL,
                    timeout_seconds=30,
                ):
                    st = (ev["object"] or {}).get("status") or {}
                    key = (st.get("currentGeneration"), st.get("replicas"), st.get("phase"))
                    if key != seen:
                        seen = key
                        self.note(
                            "job",
                            generation=key[0],
                            replicas=key[1],
                            phase=key[2],
                            members=st.get("members"),
                        )
                    if self._stop.is_set():
                        break
            except Exception:
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()

    def lines(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self.trace, key=lambda e: e["t"])

    def write(self, path: Path) -> None:
        path.write_text("".join(json.dumps(e) + "\n" for e in self.lines()))


# ------------------------------------------------------------------------------ a row


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
    k.wait_for(lambda: _has_default_sa(core, ns), 60, f"the default ServiceAccount in {ns}")
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
    (args.out / f"{stem}-events.jsonl").write_text(events.read_text())
    watch.write(args.out / f"{stem}-trace.jsonl")
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


def _has_default_sa(core: Any, ns: str) -> bool:
    return any(
        sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items
    )


# ------------------------------------------------------------------------------ report


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


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
        recs = [x for r in reps for x in r.recoveries]
        secs = [x.seconds for x in recs if x.seconds is not None]
        pauses = [x.pause for x in recs if x.pause is not None]
        lost = sum(
            max(0, x.step_before - x.resumed_step) for x in recs if x.resumed_step is not None
        )
        phases = []
        for i, name in enumerate(PHASES):
            prev = "t_evict" if i == 0 else PHASES[i - 1]
            d = [
                x.boundaries[name] - (x.t_evict if prev == "t_evict" else x.boundaries[prev])
                for x in recs
                if x.boundaries
            ]
            phases.append(f"{statistics.median(d):>9.1f}s" if d else f"{'-':>10}")
        goods = [acc.goodput(r.figures(), ideal) for r in reps]
        per_pod = [
            acc.per_pod_paid(g, r.workers, r.standbys) for g, r in zip(goods, reps, strict=True)
        ]
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
        print(
            f"{policy:<14}{mode:<10}{strategy:<6}{reps[0].pods_label():>5}"
            f"{acc.format_spread(goods):>24}{acc.format_spread(per_pod):>24}"
            f"{acc.format_spread(per_pod_s):>24}"
            f"{pct(secs, 0.5):>7.1f}s{pct(secs, 0.95):>7.1f}s{pct(pauses, 0.5):>7.1f}s"
            f"{lost:>6}{sum(r.restarts for r in reps):>9}{disr:>5}  "
            + "  ".join(phases)
            + (f"   ({failed} not recovered)" if failed else "")
            + (f"   {'; '.join(notes)}" if notes else "")
        )
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mtbf", type=float, default=60.0, help="seconds between preemptions")
    p.add_argument("--grace", type=int, default=30, help="terminationGracePeriodSeconds")
    p.add_argument("--evictions", type=int, default=10, help="preemptions per row")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument(
        "--strategies",
        default="ddp",
        help="workloads, each with its own baseline: ddp (bench/_goodput_worker.py), fsdp "
        "(FSDP2 + sharded TrainState checkpoints, bench/_goodput_fsdp_worker.py); Kubeflow "
        "runs ddp only",
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        default=0,
        help="elastic minimum of the Elastic and Standby rows and of Kubeflow's elasticPolicy "
        "(default: replicas - 1)",
    )
    p.add_argument(
        "--ideal",
        default="",
        help="SYSTEM=RATE[,...]: take this ideal rate (samples/s) from an earlier run's baseline "
        "row of the same size instead of running that system's baseline (e.g. Kubeflow=2200)",
    )
    p.add_argument("--cpu-request", default="100m", help="each worker pod's CPU request")
    p.add_argument("--memory-request", default="256Mi", help="each worker pod's memory request")
    p.add_argument("--modes", default="graceful,hard")
    p.add_argument("--baseline-seconds", type=float, default=0.0,
                   help="length of the row without evictions (default: mtbf x (evictions+1))")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--shrink-on-disruption",
        action="store_true",
        help="the Elastic row goes on with the survivors at once (spec.elastic.shrinkOnDisruption)",
    )
    p.add_argument(
        "--standby", type=int, default=1, help="the Standby row's spec.elastic.standbyReplicas"
    )
    p.add_argument(
        "--restore-point",
        action="store_true",
        help="torchjob rows hand their state to register_state and report every step: a hard "
        "loss resumes from the survivors' memory (storage checkpoints stay the fallback)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of every row (median printed)")
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "out" / "goodput",
        help="directory of the timeline plots (one SVG per row)",
    )
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--keep-cluster", action="store_true", help="leave the cluster and node up")
    args = p.parse_args(argv)
    args.run_id = time.strftime("%H%M%S")
    args.min_replicas = args.min_replicas or max(1, args.replicas - 1)
    ideal: dict[str, float] = {}
    for item in filter(None, args.ideal.split(",")):
        system, _, rate = item.partition("=")
        try:
            ideal[system] = float(rate)
        except ValueError:
            p.error(f"--ideal: {item!r} is not SYSTEM=RATE (e.g. Kubeflow=2200.5)")
    args.ideal = ideal
    if not 1 <= args.min_replicas <= args.replicas:
        p.error(f"--min-replicas must be between 1 and --replicas ({args.replicas})")
    for pol in args.policies.split(","):
        if pol not in POLICIES:
            p.error(f"--policies: unknown policy {pol!r} ({', '.join(POLICIES)})")
    for strategy in args.strategies.split(","):
        if strategy not in STRATEGIES:
            p.error(f"--strategies: unknown strategy {strategy!r} ({', '.join(STRATEGIES)})")
    for mode in args.modes.split(","):
        if mode not in ("graceful", "hard"):
            p.error(f"--modes: unknown mode {mode!r} (graceful, hard)")
    return args


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kubernetes import client

    # A run started in the background ignores SIGINT (the shell's rule for background jobs),
    # so SIGTERM and SIGINT both stop it the way Ctrl-C does: the finished rows' table, then
    # the clean-up.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)

    problem = RealNode.prerequisites_problem()
    if problem:
        print(f"the real node cannot run here: {problem}", file=sys.stderr)
        return 2
    started = time.monotonic()
    log("cluster up")
    kubeconfig = k.cluster_up()
    cluster = k.Cluster(kubeconfig=kubeconfig)
    log("images and the real node")
    node = RealNode.start()
    log(f"real node {node.name}: " + ", ".join(f"{n} {s:.0f}s" for n, s in node.timings.items()))
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    op = HelmOperator(cluster, core, OPERATOR_NS, "torchjob")
    op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
    with tempfile.TemporaryDirectory() as d:
        op.install(Path(d) / "values.yaml", "--create-namespace")
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/torchjobs.torchjob.io", "--timeout=60s"
    )
    kubeflow = None
    workdir = Path(tempfile.mkdtemp(prefix="tj-goodput-"))
    try:
        if KUBEFLOW in args.policies.split(","):
            sys.path.insert(0, str(REPO / "bench"))
            import operator_vs_kubeflow as kf

            binary, crd = kf.build_kubeflow()
            kubeflow = kf.start_kubeflow(binary, crd, kubeconfig, core, workdir)
            log(f"Kubeflow training-operator {kf.KF_VERSION} runs (log {kubeflow.log_path})")
        duration = args.baseline_seconds or args.mtbf * (args.evictions + 1)
        policies = args.policies.split(",")
        # Each system's own baseline: torchjob's (RecreateGroup without evictions) and, when
        # it runs, Kubeflow's; every row is divided by its own system's rate.
        # Each workload (--strategies) is a system of its own with its own baseline too.
        strategies = args.strategies.split(",")
        systems = [("RecreateGroup", s) for s in strategies]
        if KUBEFLOW in policies:
            systems.append((KUBEFLOW, "ddp"))
        systems = [(p, s) for p, s in systems if acc.system_of(p, s) not in args.ideal]
        baselines, rows = [], []
        index = 0
        try:
            for rep in range(args.repeats):
                for system, strategy in systems:
                    log(
                        f"repeat {rep + 1}: baseline of {system}/{strategy}, "
                        f"{duration:.0f}s without evictions"
                    )
                    baselines.append(
                        run_row(
                            args,
                            cluster,
                            core,
                            custom,
                            system,
                            "none",
                            0,
                            duration,
                            index,
                            strategy,
                        )
                    )
                    index += 1
                for mode in args.modes.split(","):
                    for strategy in strategies:
                        for policy in policies:
                            if policy == KUBEFLOW and strategy != "ddp":
                                continue
                            rows.append(
                                run_row(
                                    args,
                                    cluster,
                                    core,
                                    custom,
                                    policy,
                                    mode,
                                    args.evictions,
                                    0,
                                    index,
                                    strategy,
                                )
                            )
                            index += 1
        except KeyboardInterrupt:
            # A stopped run keeps what it measured: the rows that finished are reported.
            log(f"interrupted: the table of the {len(baselines) + len(rows)} rows that finished")
            for ns in core.list_namespace().items:  # the row that was running
                if ns.metadata.name.startswith(f"goodput-{args.run_id}-"):
                    core.delete_namespace(ns.metadata.name)
        report(args, baselines, rows)
        for path in write_timelines(args.out, baselines + rows):
            print(f"timeline: {path}")
    finally:
        if kubeflow is not None:
            kubeflow.stop()
        op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
        if not args.keep_cluster:
            subprocess.run(["bash", str(REPO / "hack" / "cluster.sh"), "down"], check=False)
    log(f"done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
