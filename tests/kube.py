"""Helpers for tests that run against the local control plane (hack/cluster.sh).

The cluster is real where it matters (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) and fake where it must be (kwok plays the kubelets), so tests
steer the fake parts through the kwok Stages in hack/kwok/stages.yaml:

- ``make_pod_exit(core, ns, pod, code)``: the pod's containers exit with ``code``
  (annotation ``kwok.torchjob.io/exit-code``; 0 -> Succeeded, otherwise Failed).
- ``make_node_not_ready(core, node)`` / ``restore_node_ready(core, node)``: the node reports
  Ready=False (label ``kwok.torchjob.io/not-ready=true``), and the real controller-manager
  taints it and evicts pods.

Never sleep in a test: ``wait_for`` polls with a monotonic deadline and fails with a
describe-like dump of the namespace, which is what one wants to read when it fails.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]
HACK_DIR = REPO_ROOT / "hack"
VERSIONS_FILE = HACK_DIR / "versions.env"
CLUSTER_SH = HACK_DIR / "cluster.sh"

# Keys that drive the kwok Stages (hack/kwok/stages.yaml).
EXIT_CODE_ANNOTATION = "kwok.torchjob.io/exit-code"
EXIT_AFTER_ANNOTATION = "kwok.torchjob.io/exit-after"
EXIT_MESSAGE_ANNOTATION = "kwok.torchjob.io/exit-message"
WAITING_REASON_ANNOTATION = "kwok.torchjob.io/waiting-reason"
NOT_READY_LABEL = "kwok.torchjob.io/not-ready"

# A slow machine (a CI runner whose host is busy, or all five sessions of `make test` on 2
# cores) makes everything take longer: TORCHJOB_TEST_TIME_SCALE (default 1; .ci/run sets 3)
# multiplies the limit of every wait and kubectl call here. A limit only bounds how long a
# failure takes to be reported: a passing wait returns as soon as its condition holds.
TIME_SCALE = max(1.0, float(os.environ.get("TORCHJOB_TEST_TIME_SCALE") or 1))


def scaled(seconds: float) -> float:
    """``seconds`` times TORCHJOB_TEST_TIME_SCALE: the limit of a wait on this machine."""
    return seconds * TIME_SCALE


GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


# --------------------------------------------------------------------------- versions, paths


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """KEY=value lines of hack/versions.env (comments and blank lines skipped)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        versions[key.strip()] = value.strip().strip("'\"")
    return versions


def testbin_root() -> Path:
    default = Path.home() / ".cache" / "torchjob" / "testbin"
    return Path(os.environ.get("TORCHJOB_TESTBIN_ROOT") or default)


def testbin_dir(component: str) -> Path:
    """Directory of one built component: kubernetes, etcd, kwok, helm or krew."""
    v = read_versions()
    version = {
        "kubernetes": v["KUBE_VERSION"],
        "etcd": v["ETCD_VERSION"],
        "kwok": v["KWOK_VERSION"],
        "helm": v["HELM_VERSION"],
        "krew": v["KREW_VERSION"],
    }[component]
    return testbin_root() / f"{component}-{version}"


def kubectl_path() -> Path:
    return testbin_dir("kubernetes") / "kubectl"


def helm_path() -> Path:
    return testbin_dir("helm") / "helm"


def krew_dir() -> Path:
    """The built krew: ``krew``, and ``kubectl-krew`` for ``kubectl krew`` on the PATH."""
    return testbin_dir("krew")


CLUSTER_BINARIES = {
    "kubernetes": ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
    "etcd": ("etcd",),
    "kwok": ("kwok", "kwokctl"),
}


def missing_binaries() -> list[Path]:
    """Control-plane binaries that `make testbin` has not built (yet)."""
    missing = []
    for component, names in CLUSTER_BINARIES.items():
        d = testbin_dir(component)
        for name in names:
            p = d / name
            if not (p.is_file() and os.access(p, os.X_OK)):
                missing.append(p)
    return missing


def go_toolchain_problem() -> str | None:
    """Why `make testbin` cannot build here, or None when a usable Go is on PATH."""
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        return "Go is not installed (needs Go >= {}, https://go.dev/dl/)".format(
            read_versions().get("GO_MIN_VERSION", "?")
        )
    return None


# --------------------------------------------------------------------------- kubectl


@functools.lru_cache(maxsize=1)
def default_kubeconfig() -> Path:
    """The kubeconfig of the hack/cluster.sh cluster (the same path the script prints)."""
    out = subprocess.run(
        ["bash", str(CLUSTER_SH), "kubeconfig"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


# What kubectl prints when the API server did not answer in time (a loaded machine: a TLS
# handshake past client-go's 10 s, a 504 from the server's own 60 s limit, a server that closed
# the connection), as opposed to an answer (a rejection, a NotFound) that a test may expect.
_TRANSIENT = (
    "TLS handshake timeout",
    "Client.Timeout exceeded",
    "connection refused",
    "connection reset by peer",
    "unexpected EOF",
    "http2: client connection lost",
    "i/o timeout",
    "context deadline exceeded",
    "the server is currently unable to handle the request",
    "the server was unable to return a response in the time allotted",
    "Timeout: request did not complete within",
    "Gateway Timeout",
    "etcdserver: request timed out",
    "etcdserver: leader changed",
)
# Verbs whose repeat leaves the cluster as one call would have (a create that timed out may
# have been carried out; a delete that did would answer NotFound the second time).
_REPEATABLE = frozenset(
    {
        "apply",
        "get",
        "describe",
        "wait",
        "logs",
        "patch",
        "label",
        "annotate",
        "scale",
        "explain",
        "api-resources",
        "api-versions",
        "top",
        "cordon",
        "uncordon",
        "version",
    }
)


def _repeatable(args: Sequence[str]) -> bool:
    if any(a.startswith("--dry-run") and a != "--dry-run=none" for a in args):
        return True
    verb = next((a for a in args if not a.startswith("-")), "")
    if verb == "delete":
        return "--ignore-not-found" in args or "--ignore-not-found=true" in args
    return verb in _REPEATABLE


def kubectl(
    *args: str,
    input: str | None = None,
    check: bool = True,
    kubeconfig: Path | str | None = None,
    timeout: float = 60.0,
    attempts: int = 4,
) -> subprocess.CompletedProcess[str]:
    """Run the built kubectl against the test cluster; stdout/stderr captured as text.

    With ``check`` a non-zero exit raises AssertionError carrying kubectl's stderr. A
    repeatable call (get, apply, patch, a dry run, ...) that failed because the API server did
    not answer in time (see ``_TRANSIENT``) is made again, up to ``attempts`` times in all: a
    busy CI machine makes the server slow, which is not what a test asserts on.
    """
    config = Path(kubeconfig or default_kubeconfig())
    cmd = [
        str(kubectl_path()),
        "--kubeconfig",
        str(config),
        # Discovery cached per cluster, not in ~/.kube/cache: what kubectl resolves (kinds,
        # short names, categories) depends on this cluster's CRDs alone, as on a new machine.
        "--cache-dir",
        str(config.parent / "kubectl-cache"),
        *args,
    ]
    tries = max(1, attempts) if _repeatable(args) else 1
    for attempt in range(1, tries + 1):
        last = attempt == tries
        try:
            proc = subprocess.run(
                cmd, input=input, capture_output=True, text=True, timeout=scaled(timeout)
            )
        except subprocess.TimeoutExpired:
            if last:
                raise
            continue
        if proc.returncode == 0 or last or not any(t in proc.stderr for t in _TRANSIENT):
            break
        time.sleep(2.0**attempt)  # back off while the server catches up
    if check and proc.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc


# --------------------------------------------------------------------------- waiting


class WaitTimeout(AssertionError):
    """wait_for ran out of time; the message says what was awaited and what the world was."""


def wait_for(
    condition: Callable[[], T | bool | None],
    timeout: float = 30.0,
    message: str | Callable[[], str] = "condition",
    *,
    interval: float = 0.1,
    core: Any | None = None,
    namespace: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    ``message`` (or its result, computed only on failure) says what was awaited. Given
    ``core`` (a CoreV1Api) and ``namespace``, the failure also shows the namespace's pods
    (phase, node, conditions, container states) and recent events. Exceptions in ``ignore``
    count as "not yet" (the last one is reported); any other exception propagates.
    """
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last_value: Any = None
    while True:
        try:
            last_value = condition()
            if last_value:
                return last_value  # type: ignore[return-value]
        except ignore as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    what = message() if callable(message) else message
    parts = [f"timed out after {timeout:g}s waiting for: {what}", f"last value: {last_value!r}"]
    if last_exc is not None:
        parts.append(f"last ignored error: {last_exc!r}")
    if core is not None and namespace is not None:
        parts.append(describe_namespace(core, namespace))
    raise WaitTimeout("\n".join(parts))


def dry_run_pod_until_admitted(
    core: Any, namespace: str, body: Mapping[str, Any], *, timeout: float = 30.0
) -> Any:
    """Dry-run the creation of ``body``, retrying while an admission plugin has not yet seen
    an object the pod names (created a moment earlier); returns the admitted pod.

    The Priority admission plugin resolves ``priorityClassName`` from its informer only (a
    just-created PriorityClass gives ``403 no PriorityClass with name X was found`` until the
    informer has it); the ServiceAccount plugin falls back to a live read, but any 403 of the
    same "not found yet" shape is retried too. Any other error is raised at once, and the
    last 403 is reported on timeout: a missing object never passes.
    """
    from kubernetes.client.exceptions import ApiException

    not_seen_yet = ("no PriorityClass with name", "error looking up service account")

    def attempt() -> Any:
        try:
            return core.create_namespaced_pod(namespace, body, dry_run="All")
        except ApiException as exc:
            if exc.status == 403 and any(s in str(exc.body) for s in not_seen_yet):
                raise _NotAdmittedYet(str(exc.body)) from exc
            raise

    return wait_for(
        attempt,
        timeout,
        f"pod {body['metadata']['name']} admitted (dry run)",
        interval=0.2,
        ignore=(_NotAdmittedYet,),
    )


class _NotAdmittedYet(Exception):
    """A 403 from an admission plugin that has not seen a just-created object."""


def create_priority_class(kube: Any, name: str, value: int, **extra: Any) -> None:
    """Create (or keep) the PriorityClass ``name`` and return once the Priority admission
    plugin resolves it (its informer, not just etcd, must have it: see
    ``dry_run_pod_until_admitted``), so that a pod created next is not refused with 403."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.SchedulingV1Api(kube).create_priority_class(
            {"metadata": {"name": name}, "value": value, **extra}
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    probe = pod_manifest(f"priority-probe-{name}"[:63].rstrip("-"), priority_class=name)
    dry_run_pod_until_admitted(client.CoreV1Api(kube), "default", probe)


def describe_namespace(core: Any, namespace: str, max_events: int = 40) -> str:
    """A compact `kubectl describe`-like view of the pods and events in a namespace."""
    lines = [f"--- namespace {namespace}: pods"]
    try:
        pods = core.list_namespaced_pod(namespace).items
    except Exception as exc:
        return f"(could not list pods in {namespace}: {exc!r})"
    for pod in pods:
        st = pod.status
        deleting = " (terminating)" if pod.metadata.deletion_timestamp else ""
        lines.append(
            f"  {pod.metadata.name}: phase={st.phase}{deleting} node={pod.spec.node_name}"
            f" priority={pod.spec.priority} nominated={st.nominated_node_name}"
        )
        for c in st.conditions or []:
            extra = " ".join(x for x in (c.reason, c.message) if x)
            lines.append(f"    condition {c.type}={c.status} {extra}".rstrip())
        for cs in st.container_statuses or []:
            state = cs.state
            if state.terminated:
                s = f"terminated exitCode={state.terminated.exit_code} reason={state.terminated.reason}"
            elif state.waiting:
                s = f"waiting reason={state.waiting.reason}"
            else:
                s = "running"
            lines.append(f"    container {cs.name}: {s} ready={cs.ready}")
    lines.append(f"--- namespace {namespace}: events (latest {max_events})")
    try:
        events = core.list_namespaced_event(namespace).items
    except Exception as exc:
        lines.append(f"  (could not list events: {exc!r})")
        return "\n".join(lines)

    def when(e: Any) -> float:
        t = e.last_timestamp or e.event_time or e.metadata.creation_timestamp
        return t.timestamp() if t else 0.0

    for e in sorted(events, key=when)[-max_events:]:
        obj = e.involved_object
        lines.append(f"  {e.type} {e.reason} {obj.kind}/{obj.name}: {e.message}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- kwok hooks


def make_pod_exit(
    core: Any,
    namespace: str,
    pod: str,
    code: int,
    after: str | None = None,
    message: str | None = None,
) -> None:
    """Make the running pod's containers exit with ``code`` (0: Succeeded, else Failed).

    ``after`` is a Go duration ("5s") the pod keeps running first; ``message`` becomes the
    containers' termination message. The pod must not yet be terminating; a Pending pod
    exits once it runs.
    """
    annotations: dict[str, str | None] = {EXIT_CODE_ANNOTATION: str(int(code))}
    annotations[EXIT_AFTER_ANNOTATION] = after
    annotations[EXIT_MESSAGE_ANNOTATION] = message
    core.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": annotations}})


def make_node_not_ready(core: Any, node: str) -> None:
    """The node reports Ready=False (as a kubelet whose runtime broke would)."""
    core.patch_node(node, {"metadata": {"labels": {NOT_READY_LABEL: "true"}}})


def restore_node_ready(core: Any, node: str, untaint: bool = False) -> None:
    """Undo make_node_not_ready. kwok reports Ready=True again and the node lifecycle
    controller removes its not-ready taint within a node-monitor period; ``untaint`` drops
    the taint right away instead (which the controller may re-add once if it is quick)."""
    core.patch_node(node, {"metadata": {"labels": {NOT_READY_LABEL: None}}})
    if untaint:
        n = core.read_node(node)
        taints = [t for t in (n.spec.taints or []) if t.key != NOT_READY_TAINT]
        if len(taints) != len(n.spec.taints or []):
            core.patch_node(node, {"spec": {"taints": [taint_dict(t) for t in taints] or None}})


def taint_dict(t: Any) -> dict[str, Any]:
    """A V1Taint as a patch writes it (key, effect, value if any)."""
    d = {"key": t.key, "effect": t.effect}
    if t.value:
        d["value"] = t.value
    return d


def node_ready_condition(core: Any, node: str) -> Any:
    """The node's Ready condition (``status``, ``reason``, ...), None if absent."""
    for c in core.read_node(node).status.conditions or []:
        if c.type == "Ready":
            return c
    return None


def node_ready_status(core: Any, node: str) -> str | None:
    """The node's Ready condition status ("True", "False", "Unknown"), None if absent."""
    c = node_ready_condition(core, node)
    return None if c is None else str(c.status)


# --------------------------------------------------------------------------- nodes

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


def fake_node_manifest(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node that kwok plays (annotation kwok.x-k8s.io/node=fake), like hack/cluster.sh's."""
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "1Ti"}
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
    if gpus:
        capacity[GPU_RESOURCE] = str(gpus)
        all_labels[GPU_NODE_LABEL] = "true"
    all_labels.update(labels or {})
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": all_labels,
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
    if taints:
        node["spec"] = {"taints": [dict(t) for t in taints]}
    return node


def add_fake_node(core: Any, name: str, timeout: float = 60.0, **kwargs: Any) -> str:
    """Register a kwok node (see fake_node_manifest for kwargs) and wait until it is Ready.

    Tests that disturb a node (fill it, make it NotReady) should use a private node of their
    own, tainted and selected, so that concurrent tests on the shared nodes are unaffected.
    Delete it with ``delete_node``.
    """
    core.create_node(fake_node_manifest(name, **kwargs))
    wait_for(lambda: node_ready_status(core, name) == "True", timeout, f"fake node {name} Ready")
    return name


def delete_node(core: Any, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


# --------------------------------------------------------------------------- pods


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    cpu: str = "100m",
    memory: str = "64Mi",
    priority_class: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    grace_seconds: int = 0,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
    image: str = "registry.k8s.io/pause:3.10",
) -> dict[str, Any]:
    """A one-container Pod (restartPolicy Never) for control-plane tests.

    ``grace_seconds`` defaults to 0 because kwok honors the grace period on deletion.
    """
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_seconds,
        "containers": [
            {"name": "main", "image": image, "resources": {"limits": limits, "requests": limits}}
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pod_condition(pod: Any, type_: str) -> Any | None:
    """The pod's condition of type ``type_`` (a V1PodCondition), or None."""
    for c in pod.status.conditions or []:
        if c.type == type_:
            return c
    return None


def wait_for_pod(
    core: Any,
    namespace: str,
    name: str,
    predicate: Callable[[Any], bool],
    timeout: float = 30.0,
    what: str = "",
) -> Any:
    """Wait until ``predicate(pod)`` holds for the pod; returns the pod (V1Pod)."""
    from kubernetes.client.exceptions import ApiException

    def check() -> Any:
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return pod if predicate(pod) else None

    return wait_for(
        check,
        timeout,
        f"pod {namespace}/{name}: {what or predicate!r}",
        core=core,
        namespace=namespace,
    )


def wait_for_pod_phase(
    core: Any, namespace: str, name: str, phase: str, timeout: float = 30.0
) -> Any:
    return wait_for_pod(
        core, namespace, name, lambda p: p.status.phase == phase, timeout, f"phase {phase}"
    )


HOLD = "torchjob.io/test-hold"
"""A finalizer that keeps a deleted pod present (terminating) until the test removes it:
as a pod that trains on, or checkpoints, in its grace period would, and so that its name
stays taken (a replacement then gets a new index) whatever the machine's speed."""


def evict_held(core: Any, namespace: str, pod: str) -> None:
    """The Eviction API takes ``pod``; :data:`HOLD` keeps it until :func:`release_held`."""
    from kubernetes import client

    core.patch_namespaced_pod(pod, namespace, {"metadata": {"finalizers": [HOLD]}})
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    core.create_namespaced_pod_eviction(pod, namespace, eviction)


def release_held(core: Any, namespace: str, pod: str) -> None:
    """Remove :data:`HOLD` (the pod may then go); a pod already gone is fine."""
    from kubernetes import client

    try:
        core.patch_namespaced_pod(pod, namespace, {"metadata": {"finalizers": None}})
    except client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise


def wait_for_pod_gone(core: Any, namespace: str, name: str, timeout: float = 30.0) -> bool:
    from kubernetes.client.exceptions import ApiException

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    return wait_for(
        gone, timeout, f"pod {namespace}/{name} to be deleted", core=core, namespace=namespace
    )


# --------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """A running hack/cluster.sh cluster, as the ``cluster`` fixture yields it."""

    kubeconfig: Path
    started_here: bool = False
    name: str = "torchjob"
    versions: dict[str, str] = field(default_factory=read_versions)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return kubectl(*args, input=input, check=check, kubeconfig=self.kubeconfig, timeout=timeout)

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Until each CRD (``name.group``) is Established. Not ``kubectl wait``: it fails at
        once while a new CRD has no ``status.conditions`` yet (its schema and CEL rules take
        a moment to compile on a busy machine)."""
        for crd in crds:

            def established(name: str = crd) -> bool:
                out = self.kubectl(
                    "get", f"crd/{name}", "-o",
                    "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                    check=False,
                )  # fmt: skip
                return out.stdout.strip() == "True"

            wait_for(established, timeout, f"CRD {crd} Established", interval=0.5)

    def api_client(self) -> Any:
        """A fresh kubernetes.client.ApiClient for this cluster (see :func:`api_client`)."""
        return api_client(self.kubeconfig)

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG, for subprocesses (an operator under test, kopf...)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def gpu_nodes(self, core: Any) -> list[str]:
        nodes = core.list_node(label_selector=f"{GPU_NODE_LABEL}=true").items
        return sorted(n.metadata.name for n in nodes)

    def cpu_nodes(self, core: Any) -> list[str]:
        nodes = core.list_node(label_selector=f"!{GPU_NODE_LABEL}").items
        return sorted(n.metadata.name for n in nodes)


def api_client(kubeconfig: Path | str) -> Any:
    """A kubernetes.client.ApiClient for ``kubeconfig`` that retries what a busy API server
    may answer with 502-504 (a 504 is its own 60 s timeout, not a verdict on the request).

    Only requests that may be repeated are retried (urllib3's default methods: GET, HEAD, PUT,
    DELETE, OPTIONS, TRACE); a POST or PATCH that timed out may have been carried out.
    """
    from kubernetes import client, config
    from urllib3.util.retry import Retry

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.retries = Retry(
        total=4,
        connect=4,
        # A server that closed the connection without an answer (seen at load 16 on 2
        # cores): the request is repeated, which only the repeatable methods above are.
        read=2,
        status_forcelist=(502, 503, 504),
        backoff_factor=1.0,
        raise_on_status=False,
    )
    return client.ApiClient(configuration)


class ComponentWatchdog:
    """Starts again a control-plane component of the test cluster that exited.

    kwokctl's binary runtime never restarts a component, where a real control plane's kubelet
    or systemd does; a kube-controller-manager that exits (it gives the API server about 10 s
    to report healthy, and a loaded machine takes longer) would leave every later test waiting
    on a ServiceAccount or ReplicaSet that never comes. Every ``period`` seconds a daemon
    thread looks at the processes kwokctl recorded (``pids/`` beside the kubeconfig) and, when
    one is gone, runs ``hack/cluster.sh revive``, which says which one and why on stderr.
    """

    def __init__(self, kubeconfig: Path, period: float = 5.0) -> None:
        import threading

        self._pids = Path(kubeconfig).parent / "pids"
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="component-watchdog", daemon=True)
        self.revived: list[str] = []

    def dead(self) -> list[str]:
        gone = []
        for pidfile in sorted(self._pids.glob("*.pid")):
            try:
                os.kill(int(pidfile.read_text().strip()), 0)
            except (OSError, ValueError):
                gone.append(pidfile.stem)
        return gone

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            gone = self.dead()
            if gone:
                self.revived.extend(gone)
                subprocess.run(["bash", str(CLUSTER_SH), "revive"], timeout=120, check=False)

    def __enter__(self) -> ComponentWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def cluster_is_healthy(kubeconfig: Path) -> bool:
    if not kubeconfig.exists() or not kubectl_path().exists():
        return False
    proc = kubectl(
        "get",
        "--raw",
        "/readyz",
        "--request-timeout=3s",
        check=False,
        kubeconfig=kubeconfig,
        timeout=10,
        attempts=1,  # a question, not a request to ride out: no cluster answers at once
    )
    return proc.returncode == 0


def cluster_up(timeout: float = 900.0) -> Path:
    """hack/cluster.sh up; returns the kubeconfig path.

    The timeout covers the script's own waits (each step up to TORCHJOB_CLUSTER_WAIT_S, and
    the lock that makes clusters one at a time), so the script, not this call, says what hung.
    """
    proc = subprocess.run(
        ["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        # The cause first: a CI page that shows one line per failed test shows this one.
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        cause = next((ln for ln in reversed(lines) if "error:" in ln), lines[-1] if lines else "")
        raise RuntimeError(f"hack/cluster.sh up failed ({proc.returncode}): {cause}\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def cluster_down(timeout: float = 120.0) -> None:
    subprocess.run(
        ["bash", str(CLUSTER_SH), "down"], capture_output=True, text=True, timeout=timeout
    )


class ClusterSessions:
    """Which live processes (pytest sessions) are using a cluster.

    Engineers share one checkout and one cluster: a session that started the cluster must
    not tear it down under another session still running tests on it.
    """

    def __init__(self, kubeconfig: Path) -> None:
        # kubeconfig = $KWOK_WORKDIR/clusters/<name>/kubeconfig.yaml
        self.dir = kubeconfig.parents[2] / "sessions" / kubeconfig.parent.name
        self.me = self.dir / str(os.getpid())

    def register(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.me.write_text(str(os.getpid()))

    def unregister(self) -> None:
        self.me.unlink(missing_ok=True)

    def others(self) -> list[int]:
        """PIDs of other live sessions (stale entries are removed)."""
        alive = []
        for entry in self.dir.glob("*") if self.dir.exists() else []:
            try:
                pid = int(entry.name)
            except ValueError:
                continue
            if pid == os.getpid():
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                entry.unlink(missing_ok=True)
                continue
            except PermissionError:
                pass
            alive.append(pid)
        return alive
