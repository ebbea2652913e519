"""What a goodput row does to its job's pods and reads of them (bench/goodput_rows.py): the
running pods a preemption draws its victim from, a hard kill of a pod's processes on this host,
and the pods' logs at the row's end."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests import kube as k

from bench.harness import write_gz


def running_pods(core: Any, ns: str, custom: Any = None) -> list[Any]:
    """Every running pod of the job, standbys included: a spot reclaim does not know which pod
    trains, so each pod is preempted at the same rate (``acc.pick_victim``). ``custom`` is
    kept for the callers' signature."""
    return [
        p
        for p in core.list_namespaced_pod(ns).items
        if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
    ]


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


def save_logs(
    cluster: k.Cluster, core: Any, ns: str, into: Path, ended: dict[str, str] | None = None
) -> None:
    """The logs of the pods left at a row's end (the last replacements among them), with the
    kubelet's timestamps: where a replacement's start went, line by line; ``ended``, the
    logs of the pods whose containers ended during the row (``<pod>-<uid>.log``); and the
    row namespace's Events and jobs (``events.json.gz``, ``torchjobs.json.gz``,
    ``pytorchjobs.json.gz``, gzip-compressed: a row's Events come to ~1 MB of JSON: the
    operator's decisions, a TorchJob's ``status.history``, a PyTorchJob's conditions)."""
    into.mkdir(parents=True, exist_ok=True)
    for what in ("events", "torchjobs", "pytorchjobs"):
        done = cluster.kubectl("-n", ns, "get", what, "-o", "json", check=False)
        write_gz(into / f"{what}.json.gz", getattr(done, "stdout", "") or "")
    for key, text in (ended or {}).items():
        (into / f"{key}.log").write_text(text or "")  # None: the kubelet had no log to give
    for pod in core.list_namespaced_pod(ns).items:
        name = pod.metadata.name
        done = cluster.kubectl(
            "-n", ns, "logs", "--timestamps", "--all-containers", name, check=False
        )
        (into / f"{name}.log").write_text(getattr(done, "stdout", "") or "")
