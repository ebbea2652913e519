"""A kubelet for one node whose containers are local processes: the e2e bridge.

kwok fakes the kubelets of the cluster's other nodes; this test helper plays a
real one for ``proc-node-0``: it registers the Node, keeps its Lease fresh,
starts every container bound to it as a subprocess (command + args + env from
the pod spec, with the pod's ``*.svc`` DNS names mapped to 127.0.0.1 since all
"pods" share this machine, and each TorchJob's rendezvous port mapped to a free
port of its own, since two jobs' pods would each have their own IP on a real
node but share 127.0.0.1 here), reports Running / Succeeded / Failed with the
exit code, and on deletion sends SIGTERM to the container's main process (as a container
runtime signals PID 1 only), SIGKILLs what is left once it exits or the grace period ends,
then removes the pod, as a kubelet does, without holding up the node's other pods. So the operator's pods run the real
torchjob runtime, and the test proves operator and runtime agree end to end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from torchjob import contract

NODE_LABEL = "torchjob.io/process-node"
TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
# What an API server that did not answer raises: an error status, or no answer at all (urllib3,
# after the client's retries; a socket error).
_UNANSWERED = (ApiException, HTTPError, OSError)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Container:
    pod: str
    namespace: str
    uid: str
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: str
    grace_s: float
    termination_log: Path
    fallback_to_logs: bool
    exit_code: int | None = None
    reported: bool = False
    kill_at: float | None = None
    """Set by a deletion: when the grace period ends (time.monotonic)."""


@dataclass
class ProcessKubelet:
    api: Any
    node: str
    workdir: Path
    cwd: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _containers: dict[str, _Container] = field(default_factory=dict)
    _threads: list[threading.Thread] = field(default_factory=list)
    _ports: dict[tuple[str, str], str] = field(default_factory=dict)
    _held: set[str] = field(default_factory=set)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    # --- node ------------------------------------------------------------------------
    def register(self) -> None:
        body = {
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    NODE_LABEL: "true",
                },
            },
            "spec": {"taints": [TAINT]},
        }
        try:
            self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        self._report_node()

    def _report_node(self) -> None:
        now = _now()
        status = {
            "capacity": {"cpu": "16", "memory": "32Gi", "pods": "20"},
            "allocatable": {"cpu": "16", "memory": "32Gi", "pods": "20"},
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "process kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "process://",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "kubeletVersion": "process-kubelet",
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": "",
                "systemUUID": "",
            },
        }
        self.core.patch_node_status(self.node, {"status": status})
        coord = client.CoordinationV1Api(self.api)
        spec = {
            "holderIdentity": self.node,
            "leaseDurationSeconds": 40,
            "renewTime": datetime.now(timezone.utc),
        }
        try:
            coord.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            coord.create_namespaced_lease(
                "kube-node-lease",
                {"metadata": {"name": self.node, "namespace": "kube-node-lease"}, "spec": spec},
            )

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.register()
        for target in (self._heartbeat, self._sync):
            t = threading.Thread(target=target, daemon=True, name=f"kubelet-{target.__name__}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        # The sync loop first: one still in _sync_pod could start a container after the kill
        # below, left running with no kubelet (seen once: a pod the operator created while
        # the test's namespace went away).
        for t in self._threads:
            t.join(30)
        for c in self._containers.values():
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.node)

    def _heartbeat(self) -> None:
        # A real kubelet never stops posting its status: an API server that answered an error,
        # closed the connection or timed out (a loaded machine) is asked again 5 s later. A
        # loop that died here let the node's lease expire and the controller-manager evict
        # every pod on it (a NodeLost the test never made).
        while not self._stop.wait(5):
            try:
                self._report_node()
            except _UNANSWERED:
                continue

    def _sync(self) -> None:
        while not self._stop.wait(0.25):
            try:
                pods = self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self.node}"
                ).items
            except _UNANSWERED:
                continue
            for pod in pods:
                try:
                    self._sync_pod(pod)
                except _UNANSWERED:
                    continue

    # --- pods -----------------------------------------------------------------------
    def _sync_pod(self, pod: Any) -> None:
        uid = pod.metadata.uid
        c = self._containers.get(uid)
        if pod.metadata.deletion_timestamp is not None:
            self._terminate(pod, c)
            return
        if c is None:
            if pod.status.phase in ("Succeeded", "Failed") or self._stop.is_set():
                return
            if any(pod.metadata.name.startswith(p) for p in self._held):
                return  # held: Pending, as behind a slow image pull, until released
            c = self._run(pod)
            self._containers[uid] = c
            self._patch_status(c, running=True)
            return
        code = c.proc.poll()
        if code is not None and not c.reported:
            c.exit_code = code if code >= 0 else 128 - code
            self._patch_status(c, running=False)
            c.reported = True

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            **self.extra_env,
        }
        for e in container.env or []:
            if e.value is not None:
                value = e.value
                if value.endswith(".svc") or value.endswith(".svc.cluster.local"):
                    value = "127.0.0.1"  # every "pod" on this node is a local process
                env[e.name] = value
            elif e.value_from and e.value_from.field_ref:
                path = e.value_from.field_ref.field_path
                env[e.name] = {
                    "metadata.name": pod.metadata.name,
                    "metadata.namespace": pod.metadata.namespace,
                    "spec.nodeName": self.node,
                }.get(path, "")
        return self._own_port(pod, env)

    def _own_port(self, pod: Any, env: dict[str, str]) -> dict[str, str]:
        """Every pod of one TorchJob gets the same rendezvous port, distinct from other jobs'
        (jobs running at once, e.g. tuning trials, would otherwise all listen on 127.0.0.1:29500)."""
        port = env.get(contract.RDZV_PORT)
        job = (pod.metadata.labels or {}).get(contract.LABEL_JOB_NAME)
        if not port or not job:
            return env
        own = self._ports.setdefault((pod.metadata.namespace, job), str(contract.free_port()))
        for name in (contract.RDZV_PORT, contract.MASTER_PORT, contract.PET_MASTER_PORT):
            if env.get(name) == port:
                env[name] = own
        return env

    def _service_account(self, pod: Any) -> dict[str, str]:
        """Project the pod's ServiceAccount token, as a kubelet mounts it (TokenRequest API)."""
        account = pod.spec.service_account_name
        if not account:
            return {}
        bound = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "uid": pod.metadata.uid,
        }
        request = {"spec": {"expirationSeconds": 3600, "boundObjectRef": bound}}
        token = self.core.create_namespaced_service_account_token(
            account, pod.metadata.namespace, request
        )
        sa_dir = self.workdir / f"sa-{pod.metadata.uid[:8]}"
        sa_dir.mkdir(parents=True, exist_ok=True)
        (sa_dir / "token").write_text(token.status.token)
        (sa_dir / "namespace").write_text(pod.metadata.namespace)
        ca = self.api.configuration.ssl_ca_cert
        if ca:
            (sa_dir / "ca.crt").write_bytes(Path(ca).read_bytes())
        host, _, port = self.api.configuration.host.split("://", 1)[-1].rpartition(":")
        return {
            contract.SERVICEACCOUNT_DIR: str(sa_dir),
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
        }

    def _run(self, pod: Any) -> _Container:
        container = pod.spec.containers[0]
        argv = [*(container.command or []), *(container.args or [])]
        log = (
            self.workdir
            / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid[:8]}.log"
        )
        # The kubelet mounts an empty file at terminationMessagePath; here the container's
        # path (passed in the env contract) is redirected to a file of this node's workdir.
        termination_log = log.with_suffix(".termination-log")
        termination_log.write_text("")
        env = self._env(pod, container)
        env[contract.TERMINATION_LOG] = str(termination_log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env={**env, **self._service_account(pod)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return _Container(
            pod=pod.metadata.name,
            namespace=pod.metadata.namespace,
            uid=pod.metadata.uid,
            name=container.name,
            proc=proc,
            log=log,
            started=_now(),
            grace_s=float(pod.spec.termination_grace_period_seconds or 30),
            termination_log=termination_log,
            fallback_to_logs=container.termination_message_policy == "FallbackToLogsOnError",
        )

    @staticmethod
    def _termination_message(c: _Container) -> str:
        """The kubelet's rule: the file's content, else (FallbackToLogsOnError and an error)
        the log's last 80 lines, at most 2048 bytes; capped at 4096 bytes."""
        text = c.termination_log.read_text(errors="replace")
        if not text and c.fallback_to_logs and c.exit_code != 0:
            lines = c.log.read_text(errors="replace").splitlines()[-80:]
            text = "\n".join(lines).encode()[-2048:].decode(errors="ignore")
        return text.encode()[:4096].decode(errors="ignore")

    def _patch_status(self, c: _Container, *, running: bool) -> None:
        now = _now()
        if running:
            state = {"running": {"startedAt": c.started}}
            phase, ready = "Running", "True"
        else:
            reason = "Completed" if c.exit_code == 0 else "Error"
            state = {
                "terminated": {
                    "exitCode": c.exit_code,
                    "reason": reason,
                    "message": self._termination_message(c) or None,
                    "startedAt": c.started,
                    "finishedAt": now,
                }
            }
            phase, ready = ("Succeeded" if c.exit_code == 0 else "Failed"), "False"
        conditions = [
            {"type": t, "status": s, "lastTransitionTime": now}
            for t, s in (
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", ready),
                ("Ready", ready),
            )
        ]
        status = {
            "phase": phase,
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "hostIP": "127.0.0.1",
            "startTime": c.started,
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": "process",
                    "imageID": "process://",
                    "ready": running,
                    "started": running,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(c.pod, c.namespace, {"status": status})

    def _terminate(self, pod: Any, c: _Container | None) -> None:
        if c is not None and c.kill_at is None and c.proc.poll() is None:
            c.kill_at = time.monotonic() + c.grace_s
            os.kill(c.proc.pid, signal.SIGTERM)
        if c is not None and c.proc.poll() is None:
            assert c.kill_at is not None
            if time.monotonic() < c.kill_at:
                return  # the next sync looks again: other pods are not held up
        if c is not None:
            # The main process ended (or its grace did): nothing of the container outlives it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait(5)
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=pod.metadata.uid),
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        self._containers.pop(pod.metadata.uid, None)

    def hold_starts(self, pod_prefix: str) -> None:
        """Start no new container of a pod named ``pod_prefix``...: its pods stay Pending (a
        node pulling a large image) until :meth:`release_starts`. Running ones go on."""
        self._held.add(pod_prefix)

    def release_starts(self, pod_prefix: str) -> None:
        self._held.discard(pod_prefix)

    def termination_messages(self, pod_prefix: str) -> list[str]:
        """Termination messages of containers whose pod name starts with ``pod_prefix``,
        oldest first (kept after their pods are gone, like the logs)."""
        files = sorted(
            self.workdir.glob(f"*_{pod_prefix}*.termination-log"), key=lambda p: p.stat().st_ctime
        )
        return [f.read_text(errors="replace") for f in files]

    def log_of(self, pod_prefix: str) -> str:
        """All logs of containers whose pod name starts with ``pod_prefix``, oldest first."""
        files = sorted(self.workdir.glob(f"*_{pod_prefix}*.log"), key=lambda p: p.stat().st_mtime)
        return "\n".join(f"==> {f.name}\n{f.read_text(errors='replace')}" for f in files)
