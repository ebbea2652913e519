"""Builders of the manifests the operator creates: worker pods, the headless Service and the
PodGroup of a gang-scheduled job.

Pure functions from the spec to dicts. Every worker pod gets the env contract
from ``torchjob.contract`` (the runtime parses the same names back), plus the
defaults a GPU user needs: a memory-backed /dev/shm, unbuffered Python output,
GPU requests equal to limits, and a grace period long enough to checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from torchjob import contract
from torchjob.api.models import GangScheduler, GangSpec, MembershipPolicy, TorchJobSpec
from torchjob.rules.drain import drain_seconds
from torchjob.rules.worker_env import worker_pod_env
from torchjob_operator.resources.initializers import mount_in_worker
from torchjob_operator.resources.owner import owner_reference

DEFAULT_GRACE_PERIOD_S = 120
"""Seconds between SIGTERM and SIGKILL: time for rank 0 to write a checkpoint."""
SHM_VOLUME = "dshm"
CHECKPOINT_VOLUME = "torchjob-checkpoint"
GPU = "nvidia.com/gpu"


def job_labels(name: str) -> dict[str, str]:
    return {contract.LABEL_JOB_NAME: name, contract.LABEL_ROLE: contract.ROLE_WORKER}


def pod_env(
    *,
    name: str,
    namespace: str,
    spec: TorchJobSpec,
    index: int,
    generation: int,
    replicas: int,
    members: Sequence[int] | None = None,
    drain_s: int = 0,
) -> contract.PodEnv:
    return worker_pod_env(
        spec,
        job_name=name,
        namespace=namespace,
        index=index,
        generation=generation,
        replicas=replicas,
        members=members,
        drain_s=drain_s,
    )


def drains_for(spec: TorchJobSpec, grace_s: int | None) -> int:
    """``TORCHJOB_DRAIN_S`` of the job's worker pods: how long one given notice trains on
    (``elastic.replaceBeforeLeaving``, KeepSurvivors only; ``torchjob.rules.drain``)."""
    el = spec.elastic
    if el is None or not el.replace_before_leaving:
        return 0
    if spec.membership_policy != MembershipPolicy.KEEP_SURVIVORS:
        return 0
    return drain_seconds(grace_s)


def _gpu_requests_equal_limits(resources: dict[str, Any]) -> None:
    """GPUs cannot be overcommitted: requests must equal limits. Quantities become strings."""
    limits = {k: str(v) for k, v in (resources.get("limits") or {}).items()}
    requests = {k: str(v) for k, v in (resources.get("requests") or {}).items()}
    resources["limits"], resources["requests"] = limits, requests
    gpus = limits.get(GPU, requests.get(GPU))
    if gpus is not None:
        limits[GPU] = gpus
        requests[GPU] = gpus
    if not limits:
        resources.pop("limits")
    if not requests:
        resources.pop("requests")


def worker_pod(
    *,
    name: str,
    namespace: str,
    uid: str,
    spec: TorchJobSpec,
    index: int,
    generation: int,
    replicas: int,
    joiner: bool = False,
    members: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The manifest of worker ``index`` of generation ``generation``.

    A ``joiner`` (an elastic job's replacement, created ahead of its generation) gets a
    tcpSocket readiness probe on ``contract.JOINER_READY_PORT``: Ready means its runtime has
    started and waits to join, so the job grows back to it without waiting for its imports."""
    template = copy.deepcopy(spec.template.to_wire())
    meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template["spec"]
    pod_name = contract.worker_pod_name(name, index)
    labels = _labels(meta, name, spec, index, generation, joiner)
    _, gang_annotations = gang_pod_metadata(name=name, gang=spec.scheduling.gang)
    _pod_settings(pod_spec, pod_name, name, spec)
    pvc = spec.checkpoint.pvc if spec.checkpoint else None
    _volumes(pod_spec, pvc)
    env = pod_env(
        name=name,
        namespace=namespace,
        spec=spec,
        index=index,
        generation=generation,
        replicas=replicas,
        members=members,
        drain_s=drains_for(spec, pod_spec.get("terminationGracePeriodSeconds")),
    ).to_env()
    for i, container in enumerate(pod_spec["containers"]):
        _container(container, env, name, pvc, first=i == 0, joiner=joiner)
    mount_in_worker(pod_spec, spec.initializers)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {**(meta.get("annotations") or {}), **gang_annotations},
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": pod_spec,
    }


def _labels(
    meta: Mapping[str, Any],
    name: str,
    spec: TorchJobSpec,
    index: int,
    generation: int,
    joiner: bool,
) -> dict[str, str]:
    """The template's labels with the job's, the pod's index and generation, Kueue's queue
    and the gang's."""
    labels = dict(meta.get("labels") or {})
    labels.update(job_labels(name))
    labels[contract.LABEL_POD_INDEX] = str(index)
    labels[contract.LABEL_GENERATION] = str(generation)
    if joiner:
        labels[contract.LABEL_JOINER] = "true"
    if spec.scheduling.queue_name:
        labels[contract.KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name
    gang_labels, _ = gang_pod_metadata(name=name, gang=spec.scheduling.gang)
    labels.update(gang_labels)
    return labels


def _pod_settings(pod_spec: dict[str, Any], pod_name: str, name: str, spec: TorchJobSpec) -> None:
    """DNS name under the headless Service, no kubelet restarts, the worker account, the
    grace period and the scheduling fields."""
    pod_spec["hostname"] = pod_name
    pod_spec["subdomain"] = name
    pod_spec["restartPolicy"] = "Never"  # the operator restarts whole groups, never single ranks
    if not pod_spec.get("serviceAccountName"):
        pod_spec["serviceAccountName"] = contract.worker_service_account(name)
    pod_spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S)
    if spec.scheduling.scheduler_name:
        pod_spec["schedulerName"] = spec.scheduling.scheduler_name
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    if "topologySpreadConstraints" not in pod_spec:
        pod_spec["topologySpreadConstraints"] = [spread_across_nodes(name)]


def avoid_nodes(pod: dict[str, Any], nodes: Sequence[str]) -> None:
    """Keep a new pod off ``nodes`` (noticed or not reporting: ``common.nodes.avoided``), in
    place: ``metadata.name NotIn nodes`` added to every term of its required node affinity
    (terms are ORed, so each needs it), or one term of its own. A termination handler's
    taint is NoSchedule, but a pod that tolerates every taint (``operator: Exists``) would
    still go there, and the node controller's not-ready taint comes only after the Node
    says so."""
    if not nodes:
        return
    affinity = pod["spec"].setdefault("affinity", {})
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchFields", []).extend(not_on(nodes))


def prefer_other_nodes(pod: dict[str, Any], nodes: Sequence[str]) -> None:
    """Rather not on ``nodes`` (in place): a preference (weight 100) against the nodes of
    pods their peers reported silent. Such a node may have vanished while the API server
    still shows it Ready (for about 40 s), or be cut off from the job; but a silent pod may
    also be a hung process on the only node with room, so it is only a preference."""
    if not nodes:
        return
    node = pod["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    preferred = node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append({"weight": 100, "preference": {"matchFields": not_on(nodes)}})


def not_on(nodes: Sequence[str]) -> list[dict[str, Any]]:
    """Requirements (ANDed) keeping a pod off ``nodes``: one each (the API server's rule)."""
    return [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in sorted(nodes)]


def spread_across_nodes(name: str) -> dict[str, Any]:
    """The default spread of a job's workers: as evenly over nodes as the scheduler can
    (``ScheduleAnyway``: never a reason to stay Pending), so that a lost node takes a known
    share of the job (issue 39). A template with ``topologySpreadConstraints`` of its own
    (``[]`` turns it off), in the job or its blueprint, replaces it."""
    return {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": job_labels(name)},
    }


def _volumes(pod_spec: dict[str, Any], pvc: Any) -> None:
    """Shared memory for the data loaders, and the checkpoint claim."""
    volumes: list[dict[str, Any]] = pod_spec.setdefault("volumes", [])
    names = {v.get("name") for v in volumes}
    if SHM_VOLUME not in names:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    if pvc and CHECKPOINT_VOLUME not in names:
        volumes.append(
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": pvc.claim_name}}
        )


def _container(
    container: dict[str, Any],
    env: Mapping[str, str],
    name: str,
    pvc: Any,
    *,
    first: bool,
    joiner: bool,
) -> None:
    """One container of the worker: the env contract, its mounts, GPU requests; the first
    also the joiner's readiness probe and the rendezvous port."""
    contract_env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
    contract_env.append(
        {"name": contract.POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    contract_env.append({"name": contract.SERVICE_NAME, "value": name})
    user_env = [
        e
        for e in container.get("env") or []
        if e.get("name") not in env and e.get("name") != contract.TERMINATION_LOG
    ]
    # Contract variables win: a stale RANK in the template must never reach the workers.
    # The termination log is where the runtime leaves its root-cause summary; without one
    # (a static-mode script), the tail of the log stands in for it on an error.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    termination_log = container.get("terminationMessagePath") or contract.DEFAULT_TERMINATION_LOG
    container["env"] = [
        *user_env,
        *contract_env,
        {"name": contract.TERMINATION_LOG, "value": termination_log},
    ]
    mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
    mounted = {m.get("mountPath") for m in mounts}
    if "/dev/shm" not in mounted:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if pvc and pvc.mount_path not in mounted:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": pvc.mount_path})
    _gpu_requests_equal_limits(container.setdefault("resources", {}))
    if not first:
        return
    if joiner and "readinessProbe" not in container:
        container["readinessProbe"] = {
            "tcpSocket": {"port": contract.JOINER_READY_PORT},
            "periodSeconds": 1,
            "failureThreshold": 1,
        }
    ports: list[dict[str, Any]] = container.setdefault("ports", [])
    if not any(p.get("containerPort") == contract.DEFAULT_RDZV_PORT for p in ports):
        ports.append(
            {"name": "rdzv", "containerPort": contract.DEFAULT_RDZV_PORT, "protocol": "TCP"}
        )


def headless_service(*, name: str, namespace: str, uid: str) -> dict[str, Any]:
    """One DNS name per worker (``<job>-worker-<i>.<job>``), published before pods are Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": job_labels(name),
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": job_labels(name),
            "ports": [
                {
                    "name": "rdzv",
                    "port": contract.DEFAULT_RDZV_PORT,
                    "targetPort": contract.DEFAULT_RDZV_PORT,
                }
            ],
        },
    }


PROBE_IMAGE = "registry.k8s.io/pause:3.10"


def probe_pod(
    *, name: str, namespace: str, uid: str, spec: TorchJobSpec, index: int
) -> dict[str, Any]:
    """A worker-sized placeholder: does one more worker fit right now?

    Same resources, node selection and tolerations as a worker, a pause container,
    no priority class (a probe must never preempt anyone) and no Kueue label.
    """
    template = copy.deepcopy(spec.template.to_wire())
    pod_spec: dict[str, Any] = template["spec"]
    worker = pod_spec["containers"][0]
    resources = copy.deepcopy(worker.get("resources") or {})
    _gpu_requests_equal_limits(resources)
    keep = ("nodeSelector", "affinity", "tolerations", "schedulerName", "topologySpreadConstraints")
    probe_spec: dict[str, Any] = {k: pod_spec[k] for k in keep if k in pod_spec}
    if spec.scheduling.scheduler_name:
        probe_spec["schedulerName"] = spec.scheduling.scheduler_name
    probe_spec.update(
        restartPolicy="Never",
        terminationGracePeriodSeconds=0,
        automountServiceAccountToken=False,
        containers=[{"name": "probe", "image": PROBE_IMAGE, "resources": resources}],
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": contract.probe_pod_name(name, index),
            "namespace": namespace,
            "labels": {contract.LABEL_JOB_NAME: name, contract.LABEL_ROLE: contract.ROLE_PROBE},
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": probe_spec,
    }


# --- gang scheduling (spec.scheduling.gang) ---------------------------------------------
# The PodGroup is named after the job; its minMember is the number of pods of the generation
# being created, so an elastic resize or a `kubectl scale` moves it with the job (issue 17).
# Coscheduling (scheduler-plugins) finds a pod's group by a label, Volcano by an annotation.

COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"


def pod_group(
    *, name: str, namespace: str, uid: str, gang: GangSpec, min_member: int
) -> dict[str, Any]:
    """The PodGroup of job ``name`` holding ``min_member`` pods (owned by the job)."""
    spec: dict[str, Any] = {"minMember": min_member}
    if gang.pod_group == GangScheduler.COSCHEDULING:
        api = COSCHEDULING_API
        if gang.schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
    else:
        api = VOLCANO_API
        if gang.queue is not None:
            spec["queue"] = gang.queue
    return {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": job_labels(name),
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": spec,
    }


def gang_pod_metadata(*, name: str, gang: GangSpec | None) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a worker pod into its job's PodGroup."""
    if gang is None:
        return {}, {}
    if gang.pod_group == GangScheduler.COSCHEDULING:
        return {COSCHEDULING_LABEL: name}, {}
    return {}, {VOLCANO_ANNOTATION: name}
