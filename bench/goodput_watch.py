"""What the control plane said when, during a goodput row: the pods' and the TorchJob's trace."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.goodput_cpu import CpuSampler
from bench.harness import write_jsonl
from torchjob.api.models import GROUP, PLURAL, VERSION


def pod_summary(pod: Any) -> dict[str, Any]:
    """What a trace line says of a pod: its phase, readiness, and each container's state."""
    status = pod.status
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
    states = []
    finished = []
    for cs in status.container_statuses or ():
        if cs.state.terminated is not None:
            states.append(f"terminated:{cs.state.terminated.exit_code}")
            if (at := cs.state.terminated.finished_at) is not None:
                finished.append(at.timestamp())
        elif cs.state.running is not None:
            states.append("running")
        else:
            states.append("waiting")
    out = {
        "phase": status.phase,
        "ready": ready,
        "containers": states,
        "deleting": pod.metadata.deletion_timestamp is not None,
    }
    # When the last container ended, as the kubelet says (whole seconds): a pod that stops
    # splits into its processes' exit and the kubelet's report of it.
    return {**out, "finished": max(finished)} if finished else out


class PodWatch:
    """Wall-clock times at which pods of the job appear (watch ADDED), by UID, and a trace of
    what the control plane said when: each pod's phase, readiness and container states as
    they change (and a ``pod-gone`` line when one is deleted), and each generation the
    TorchJob's status publishes. ``goodput_profile.py`` puts it beside the workers' events, so
    a recovery splits into what Kubernetes took (the kubelet's report of a dead container, the
    operator's decision) and what the runtime took; ``acc.pod_seconds`` reads the pods paid.
    With ``cpu_nodes`` (real node name -> its CPU cgroup), a ``cpu`` line every second too
    (bench/goodput_cpu.py: who took the CPU)."""

    def __init__(
        self, core: Any, ns: str, custom: Any = None, cpu_nodes: Mapping[str, Path] | None = None
    ) -> None:
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
        self._cpu = CpuSampler(cpu_nodes, self.note) if cpu_nodes else None

    def note(self, what: str, **fields: Any) -> None:
        with self._lock:
            self.trace.append({"t": time.time(), "what": what, **fields})

    def _run(self) -> None:
        from kubernetes import watch

        # Each 30 s stream resumes at the last one's resourceVersion, so that a pod deleted
        # between two streams still has its DELETED event (a fresh list would not say so).
        rv: str | None = None
        while not self._stop.is_set():
            w = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                since = {"resource_version": rv} if rv else {}
                for ev in w.stream(  # type: ignore[no-untyped-call]
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

    def _keep_log(self, name: str, uid: str, suffix: str = "") -> threading.Thread:
        """Read an ended pod's log now, beside the watch (the pod may go any moment)."""

        def read() -> None:
            try:
                text = self.core.read_namespaced_pod_log(name, self.ns, timestamps=True)
            except Exception as exc:  # gone already: say so in its place
                text = f"(log not read: {exc})"
            with self._lock:
                self.ended_logs[f"{name}-{uid[:8]}{suffix}"] = text

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread

    def keep_logs_before_vanish(self, pods: list[Any], within_s: float = 3.0) -> None:
        """Read the logs of ``pods`` (on a node about to vanish) now, waiting up to
        ``within_s``: once the node is gone its kubelet answers nothing, and a pod that was
        still running there would leave no log (``<pod>-<uid>-before-vanish.log``)."""
        threads = [self._keep_log(p.metadata.name, p.metadata.uid, "-before-vanish") for p in pods]
        deadline = time.monotonic() + within_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _run_job(self) -> None:
        from kubernetes import watch

        seen: tuple[Any, ...] | None = None
        while not self._stop.is_set():
            w = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for ev in w.stream(  # type: ignore[no-untyped-call]
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
        if self._cpu is not None:
            self._cpu.stop()

    def lines(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self.trace, key=lambda e: e["t"])

    def write(self, path: Path) -> None:
        write_jsonl(path, self.lines())
