"""What `kubectl apply` of a TorchJob gets from the real API server: the one table (issue 7).

``INVALID``: manifests people really write wrong, each with a one-line reason and a substring
the API server's message must contain (the field and the fix). They are sent as `kubectl
apply` sends them (strict field validation) as server-side dry-run creates: one request each.
``UPDATES``: changes to an existing job the server must refuse (immutability, scale bounds).
``VALID``: edge cases that must be accepted *and* run: all of them are created for real with
the operator running; each must get all its pods (and the pod of its highest possible index,
e.g. ``elastic.maxReplicas - 1``, must pass a server-side dry-run create), and the operator
log must hold no traceback.
The last test stores a job under a laxer CRD (an upgrade's leftover) and checks that the
operator answers it with ``InvalidSpec`` on the first reconcile.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests import kube as k
from tests.cluster.operator_harness import CRD_FILE, Jobs, OperatorProcess

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION, TorchJobSpec
from torchjob_operator.resources.owner import owner_reference
from torchjob_operator.resources.pods import worker_pod
from torchjob_operator.resources.rbac import worker_rbac

PRIORITY_CLASS = "torchjob-admission-test"
DELETE = object()
"""A value in a change: remove that key."""


def base(name: str = "tj", replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                }
            },
        },
    }


def _set(obj: Any, path: str, value: Any) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        obj = obj[int(key)] if isinstance(obj, list) else obj.setdefault(key, {})
    last = keys[-1]
    if isinstance(obj, list):
        obj[int(last)] = value
    elif value is DELETE:
        obj.pop(last, None)
    else:
        obj[last] = value


C0 = "spec.template.spec.containers.0"
TS = "spec.template.spec"


@dataclass
class Case:
    reason: str
    changes: dict[str, Any]
    message: str = ""
    """Substring of the API server's message (INVALID) ."""
    name: str = "tj"
    replicas: int = 2
    pods: int | None = None
    """VALID: pods the operator creates (default: spec.replicas)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def manifest(self, name: str | None = None) -> dict[str, Any]:
        body = base(name or self.name, self.replicas)
        for path, value in self.changes.items():
            _set(body, path, value if value is DELETE else copy.deepcopy(value))
        return body


def c(reason: str, message: str, **kw: Any) -> Case:
    changes = kw.pop("changes", {})
    return Case(reason, changes, message, **kw)


LONG56 = "a" * 56
LONG54 = "b" * 54
GPU = "nvidia.com/gpu"

INVALID: list[Case] = [
    # --- runtime blueprints: what the API server checks of a job with spec.runtimeRef ------
    c("no template, no runtimeRef", "spec.template is required", changes={"spec.template": DELETE}),
    c(
        "runtimeRef of another kind",
        "spec.runtimeRef.kind: Unsupported value",
        changes={"spec.runtimeRef": {"name": "x", "kind": "TrainingRuntime"}},
    ),
    c(
        "runtimeRef name not a DNS name",
        "spec.runtimeRef.name",
        changes={"spec.runtimeRef": {"name": "Bad_Name"}},
    ),
    # --- typos: strict field validation names the unknown field -------------------------
    c("typo replica", 'unknown field "spec.replica"', changes={"spec.replica": 3}),
    c(
        "typo resource (pods would get no GPUs)",
        'unknown field "spec.template.spec.containers[0].resource"',
        changes={f"{C0}.resource": {"limits": {GPU: 1}}},
    ),
    c(
        "typo valu in env",
        'unknown field "spec.template.spec.containers[0].env[0].valu"',
        changes={f"{C0}.env": [{"name": "A", "valu": "1"}]},
    ),
    c(
        "typo nodeSelecter",
        'unknown field "spec.template.spec.nodeSelecter"',
        changes={f"{TS}.nodeSelecter": {"gpu": "a100"}},
    ),
    c(
        "typo maxRestart",
        'unknown field "spec.failurePolicy.maxRestart"',
        changes={"spec.failurePolicy": {"maxRestart": 3}},
    ),
    c(
        "typo minReplica",
        'unknown field "spec.elastic.minReplica"',
        changes={"spec.elastic": {"minReplica": 1, "minReplicas": 1, "maxReplicas": 4}},
    ),
    c(
        "typo label in template metadata",
        'unknown field "spec.template.metadata.label"',
        changes={"spec.template.metadata": {"label": {"a": "b"}}},
    ),
    c(
        "typo claim in pvc",
        'unknown field "spec.checkpoint.pvc.claim"',
        changes={"spec.checkpoint": {"pvc": {"claim": "x", "claimName": "x"}}},
    ),
    c(
        "typo ttlSecondsAfterFinish",
        'unknown field "spec.runPolicy.ttlSecondsAfterFinish"',
        changes={"spec.runPolicy": {"ttlSecondsAfterFinish": 60}},
    ),
    c(
        "typo limit in resources",
        'unknown field "spec.template.spec.containers[0].resources.limit"',
        changes={f"{C0}.resources": {"limit": {GPU: 1}}},
    ),
    c(
        "typo toleration",
        'unknown field "spec.template.spec.toleration"',
        changes={f"{TS}.toleration": [{"key": "gpu"}]},
    ),
    c(
        "name in template metadata (the operator names pods)",
        'unknown field "spec.template.metadata.name"',
        changes={"spec.template.metadata": {"name": "mine"}},
    ),
    # --- numbers ---------------------------------------------------------------------------
    c("replicas zero", "spec.replicas: Invalid value: 0", changes={"spec.replicas": 0}),
    c("replicas negative", "should be greater than or equal to 1", changes={"spec.replicas": -1}),
    c(
        "replicas as a word",
        'spec.replicas: Invalid value: "string"',
        changes={"spec.replicas": "two"},
    ),
    c(
        "replicas above the bound",
        "should be less than or equal to 10000",
        changes={"spec.replicas": 10001},
    ),
    c("replicas fractional", "spec.replicas", changes={"spec.replicas": 2.5}),
    c(
        "nprocPerNode zero",
        "spec.nprocPerNode must be an integer from 1 to 1024",
        changes={"spec.nprocPerNode": 0},
    ),
    c(
        "nprocPerNode 2^32",
        "spec.nprocPerNode must be an integer from 1 to 1024",
        changes={"spec.nprocPerNode": 4294967296},
    ),
    c(
        "nprocPerNode a word",
        "spec.nprocPerNode must be an integer from 1 to 1024",
        changes={"spec.nprocPerNode": "lots"},
    ),
    c(
        "nprocPerNode quoted number",
        "'gpu' (one process per requested GPU) or 'auto'",
        changes={"spec.nprocPerNode": "8"},
    ),
    c(
        "elastic min above max",
        "spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas",
        changes={"spec.elastic": {"minReplicas": 3, "maxReplicas": 2}, "spec.replicas": 2},
    ),
    c(
        "replicas above elastic max",
        "spec.replicas must lie between",
        changes={"spec.elastic": {"minReplicas": 1, "maxReplicas": 4}, "spec.replicas": 9},
    ),
    c(
        "elastic minReplicas zero",
        "spec.elastic.minReplicas",
        changes={"spec.elastic": {"minReplicas": 0, "maxReplicas": 4}},
    ),
    c(
        "negative scaleDownAfterSeconds",
        "spec.elastic.scaleDownAfterSeconds",
        changes={"spec.elastic": {"minReplicas": 1, "maxReplicas": 4, "scaleDownAfterSeconds": -5}},
    ),
    c(
        "maxRestarts negative",
        "spec.failurePolicy.maxRestarts",
        changes={"spec.failurePolicy": {"maxRestarts": -1}},
    ),
    c(
        "maxRestarts 100000",
        "should be less than or equal to 10000",
        changes={"spec.failurePolicy": {"maxRestarts": 100000}},
    ),
    c(
        "backoff initial above (default) max",
        "backoff.initialSeconds must not exceed maxSeconds",
        changes={"spec.failurePolicy": {"backoff": {"initialSeconds": 600}}},
    ),
    c(
        "backoff factor below 1",
        "spec.failurePolicy.backoff.factor",
        changes={"spec.failurePolicy": {"backoff": {"factor": 0.5}}},
    ),
    c(
        "backoff factor 1000",
        "should be less than or equal to 100",
        changes={"spec.failurePolicy": {"backoff": {"factor": 1000}}},
    ),
    c(
        "retryable exit code 0",
        "spec.failurePolicy.retryableExitCodes[0]",
        changes={"spec.failurePolicy": {"retryableExitCodes": [0]}},
    ),
    c(
        "exit code 256",
        "spec.failurePolicy.permanentExitCodes[0]",
        changes={"spec.failurePolicy": {"permanentExitCodes": [256]}},
    ),
    c(
        "exit code -1",
        "spec.failurePolicy.permanentExitCodes[1]",
        changes={"spec.failurePolicy": {"permanentExitCodes": [2, -1]}},
    ),
    c(
        "exit code in both lists",
        "an exit code cannot be both retryable and permanent",
        changes={"spec.failurePolicy": {"permanentExitCodes": [2], "retryableExitCodes": [2, 3]}},
    ),
    c(
        "activeDeadlineSeconds zero",
        "spec.runPolicy.activeDeadlineSeconds",
        changes={"spec.runPolicy": {"activeDeadlineSeconds": 0}},
    ),
    c(
        "ttl negative",
        "spec.runPolicy.ttlSecondsAfterFinished",
        changes={"spec.runPolicy": {"ttlSecondsAfterFinished": -1}},
    ),
    c(
        "cleanPodPolicy Always",
        'spec.runPolicy.cleanPodPolicy: Unsupported value: "Always"',
        changes={"spec.runPolicy": {"cleanPodPolicy": "Always"}},
    ),
    c("backend mpi", 'spec.backend: Unsupported value: "mpi"', changes={"spec.backend": "mpi"}),
    c(
        "membershipPolicy misspelt",
        "spec.membershipPolicy: Unsupported value",
        changes={"spec.membershipPolicy": "KeepSurvivor"},
    ),
    c(
        "suspend as a string",
        "spec.runPolicy.suspend",
        changes={"spec.runPolicy": {"suspend": "yes"}},
    ),
    # --- names -----------------------------------------------------------------------------
    c(
        "56-char name, 2 workers: hostname too long",
        "metadata.name is too long",
        name=LONG56,
    ),
    c(
        "54-char name, maxReplicas 16: -worker-15 too long",
        "metadata.name is too long",
        name=LONG54,
        changes={"spec.elastic": {"minReplicas": 1, "maxReplicas": 16}},
    ),
    c("dot in name", "metadata.name must be a DNS label", name="resnet.v2"),
    c("name ends with '-'", "metadata.name must be a DNS label", name="run-"),
    # --- scheduling and checkpoint -----------------------------------------------------------
    c(
        "queueName with a space",
        "spec.scheduling.queueName must be a valid label value",
        changes={"spec.scheduling": {"queueName": "team a"}},
    ),
    c(
        "queueName 64 chars",
        "spec.scheduling.queueName",
        changes={"spec.scheduling": {"queueName": "q" * 64}},
    ),
    c(
        "queueName empty",
        "spec.scheduling.queueName",
        changes={"spec.scheduling": {"queueName": ""}},
    ),
    c(
        "priorityClassName with underscore",
        "spec.scheduling.priorityClassName must be a PriorityClass name",
        changes={"spec.scheduling": {"priorityClassName": "High_Priority"}},
    ),
    c(
        "pvc claimName uppercase",
        "spec.checkpoint.pvc.claimName must be a PersistentVolumeClaim name",
        changes={"spec.checkpoint": {"pvc": {"claimName": "My_PVC"}}},
    ),
    c(
        "checkpoint path empty (used to crash the operator)",
        "spec.checkpoint.path",
        changes={"spec.checkpoint": {"path": ""}},
    ),
    c(
        "checkpoint without storage",
        "spec.checkpoint needs a path",
        changes={"spec.checkpoint": {}},
    ),
    c(
        "pvc mountPath relative",
        "spec.checkpoint.pvc.mountPath must be an absolute path",
        changes={"spec.checkpoint": {"pvc": {"claimName": "ck", "mountPath": "checkpoints"}}},
    ),
    c(
        "pvc mountPath /dev/shm",
        "other than /dev/shm",
        changes={"spec.checkpoint": {"pvc": {"claimName": "ck", "mountPath": "/dev/shm"}}},
    ),
    c(
        "pvc mountPath /dev/shm with a trailing slash",
        "other than /dev/shm",
        changes={"spec.checkpoint": {"pvc": {"claimName": "ck", "mountPath": "/dev/shm//"}}},
    ),
    c(
        "initializer volume mounted at /dev/shm",
        "spec.initializers.volume.mountPath must be an absolute path other than / and /dev/shm",
        changes={
            "spec.initializers": {
                "volume": {"claimName": "data", "mountPath": "/dev/shm/"},
                "dataset": {"uri": "s3://bucket/train"},
            }
        },
    ),
    c(
        "initializer volume mounted at a relative path",
        "spec.initializers.volume.mountPath must be an absolute path",
        changes={
            "spec.initializers": {
                "volume": {"claimName": "data", "mountPath": "data"},
                "model": {"uri": "hf://org/model"},
            }
        },
    ),
    c(
        "pvc mountPath already used by the template",
        "spec.checkpoint.pvc.mountPath is already a mountPath in the template",
        changes={
            "spec.checkpoint": {"pvc": {"claimName": "ck"}},
            f"{C0}.volumeMounts": [{"name": "data", "mountPath": "/checkpoints"}],
            f"{TS}.volumes": [{"name": "data", "emptyDir": {}}],
        },
    ),
    c(
        "schedulerName in both places, different",
        "spec.scheduling.schedulerName and spec.template.spec.schedulerName differ",
        changes={
            "spec.scheduling": {"schedulerName": "volcano"},
            f"{TS}.schedulerName": "default-scheduler",
        },
    ),
    c(
        "priorityClassName in both places, different",
        "spec.scheduling.priorityClassName and spec.template.spec.priorityClassName differ",
        changes={
            "spec.scheduling": {"priorityClassName": "high"},
            f"{TS}.priorityClassName": "low",
        },
    ),
    c(
        "queue label and queueName differ",
        "spec.scheduling.queueName and the template's kueue.x-k8s.io/queue-name label differ",
        changes={
            "spec.scheduling": {"queueName": "a"},
            "spec.template.metadata": {"labels": {"kueue.x-k8s.io/queue-name": "b"}},
        },
    ),
    # --- the pod template --------------------------------------------------------------------
    c("no image", "container image is required", changes={f"{C0}.image": DELETE}),
    c("empty image", "container image is required", changes={f"{C0}.image": " "}),
    c("no containers", "spec.template.spec.containers", changes={f"{TS}.containers": []}),
    c(
        "memory: lots",
        'spec.template.spec.containers[0].resources.limits.memory: Invalid value: "lots"',
        changes={f"{C0}.resources": {"limits": {"memory": "lots"}}},
    ),
    c(
        "gpu -1",
        "resources.limits and resources.requests must not be negative",
        changes={f"{C0}.resources": {"limits": {GPU: -1}}},
    ),
    c(
        "gpu 0.5 as a YAML number",
        "resources.limits.nvidia.com/gpu in body must be of type integer,string",
        changes={f"{C0}.resources": {"limits": {GPU: 0.5}}},
    ),
    c(
        "gpu '0.5' as a string",
        "nvidia.com/gpu must be a whole number of GPUs",
        changes={f"{C0}.resources": {"limits": {GPU: "0.5"}}},
    ),
    c(
        "gpu 500m with nprocPerNode gpu (used to crash the operator)",
        "nvidia.com/gpu must be a whole number of GPUs",
        changes={"spec.nprocPerNode": "gpu", f"{C0}.resources": {"limits": {GPU: "500m"}}},
    ),
    c(
        "gpu requests 2, limits 4 (was silently made 4/4)",
        "must be equal when both are given",
        changes={f"{C0}.resources": {"requests": {GPU: 2}, "limits": {GPU: 4}}},
    ),
    c(
        "memory requests above limits",
        "resources.requests must not exceed resources.limits",
        changes={f"{C0}.resources": {"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}}},
    ),
    c(
        "cpu negative request",
        "must not be negative",
        changes={f"{C0}.resources": {"requests": {"cpu": "-1"}}},
    ),
    c(
        "imagePullPolicy Sometimes",
        'imagePullPolicy: Unsupported value: "Sometimes"',
        changes={f"{C0}.imagePullPolicy": "Sometimes"},
    ),
    c(
        "container name uppercase",
        "container name must be a DNS label",
        changes={f"{C0}.name": "Trainer"},
    ),
    c(
        "container name with underscore",
        "container name must be a DNS label",
        changes={f"{C0}.name": "my_trainer"},
    ),
    c(
        "duplicate container names",
        "spec.template.spec.containers[1]: Duplicate value",
        changes={f"{TS}.containers": [{"name": "t", "image": "i"}, {"name": "t", "image": "j"}]},
    ),
    c(
        "init container without image",
        "container image is required",
        changes={f"{TS}.initContainers": [{"name": "init"}]},
    ),
    c(
        "env name with =",
        "env name must be printable ASCII without '='",
        changes={f"{C0}.env": [{"name": "A=B", "value": "1"}]},
    ),
    c(
        "env name with a newline",
        "env name must be printable ASCII without '='",
        changes={f"{C0}.env": [{"name": "A\nB", "value": "1"}]},
    ),
    c(
        "env without a name",
        "spec.template.spec.containers[0].env[0].name: Required value",
        changes={f"{C0}.env": [{"value": "1"}]},
    ),
    c(
        "duplicate env names",
        "spec.template.spec.containers[0].env[1]: Duplicate value",
        changes={f"{C0}.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
    ),
    c(
        "volumeMount without a volume",
        "every volumeMount in spec.template.spec.containers and initContainers must name a volume",
        changes={f"{C0}.volumeMounts": [{"name": "data", "mountPath": "/data"}]},
    ),
    c(
        "checkpoint volume mounted without a pvc",
        "torchjob-checkpoint needs spec.checkpoint.pvc",
        changes={f"{C0}.volumeMounts": [{"name": "torchjob-checkpoint", "mountPath": "/ck"}]},
    ),
    c(
        "template label value with a space",
        "labels must be valid label keys",
        changes={"spec.template.metadata": {"labels": {"team": "team a"}}},
    ),
    c(
        "template label key with two slashes",
        "labels must be valid label keys",
        changes={"spec.template.metadata": {"labels": {"a/b/c": "x"}}},
    ),
    c(
        "template label value 64 chars",
        "spec.template.metadata.labels.x",
        changes={"spec.template.metadata": {"labels": {"x": "v" * 64}}},
    ),
    c(
        "1 MiB of annotations",
        "annotations may total at most 256 KiB",
        changes={
            "spec.template.metadata": {"annotations": {f"a{i}": "x" * 200_000 for i in range(5)}}
        },
    ),
    c(
        "restartPolicy Always (was silently made Never)",
        "spec.template.spec.restartPolicy must be Never",
        changes={f"{TS}.restartPolicy": "Always"},
    ),
    c(
        "restartPolicy OnFailure",
        "spec.template.spec.restartPolicy must be Never",
        changes={f"{TS}.restartPolicy": "OnFailure"},
    ),
    c(
        "hostname in template (operator sets it)",
        "hostname and subdomain are set by the operator",
        changes={f"{TS}.hostname": "mine"},
    ),
    c(
        "reserved label in template",
        "must not set torchjob.io/job-name, torchjob.io/role",
        changes={"spec.template.metadata": {"labels": {"torchjob.io/role": "master"}}},
    ),
    c(
        "terminationMessagePolicy misspelt",
        "terminationMessagePolicy: Unsupported value",
        changes={f"{C0}.terminationMessagePolicy": "Fallback"},
    ),
    c(
        "ephemeral containers on create",
        "spec.template.spec.ephemeralContainers",
        changes={f"{TS}.ephemeralContainers": [{"name": "debug", "image": "busybox"}]},
    ),
    c(
        "containerPort as a word",
        "spec.template.spec.containers[0].ports[0].containerPort",
        changes={f"{C0}.ports": [{"containerPort": "http"}]},
    ),
    c(
        "terminationGracePeriodSeconds as a duration",
        "spec.template.spec.terminationGracePeriodSeconds",
        changes={f"{TS}.terminationGracePeriodSeconds": "30s"},
    ),
]

# (reason, change applied to the created job, message). Dry-run patches of one real job.
UPDATES: list[tuple[str, dict[str, Any], str]] = [
    (
        "adding a checkpoint",
        {"spec": {"checkpoint": {"path": "/ck"}}},
        "spec.checkpoint is immutable",
    ),
    ("changing the backend", {"spec": {"backend": "nccl"}}, "spec.backend is immutable"),
    ("changing nprocPerNode", {"spec": {"nprocPerNode": 2}}, "spec.nprocPerNode is immutable"),
    (
        "changing membershipPolicy",
        {"spec": {"membershipPolicy": "KeepSurvivors"}},
        "spec.membershipPolicy is immutable",
    ),
    (
        "adding a runtimeRef",
        {"spec": {"runtimeRef": {"name": "x"}}},
        "spec.runtimeRef is immutable",
    ),
]
UPDATES_WITH_CHECKPOINT: list[tuple[str, dict[str, Any], str]] = [
    ("removing the checkpoint", {"spec": {"checkpoint": None}}, "spec.checkpoint is immutable"),
    (
        "changing the checkpoint path",
        {"spec": {"checkpoint": {"path": "/other"}}},
        "spec.checkpoint is immutable",
    ),
]

VALID: list[Case] = [
    Case("minimal: one worker", {}, replicas=1),
    Case("name exactly 54 chars with 2 workers (hostname is 63)", {}, name="v" * 54),
    Case(
        "53-char name with elastic maxReplicas 10 (-worker-9 fits)",
        {"spec.elastic": {"minReplicas": 1, "maxReplicas": 10}},
        name="e" * 53,
    ),
    Case(
        "GPUs as an integer limit only, nprocPerNode gpu",
        {"spec.nprocPerNode": "gpu", f"{C0}.resources": {"limits": {GPU: 8}}},
    ),
    Case(
        "GPU requests only (limits filled in, as Kubernetes requires)",
        {f"{C0}.resources": {"requests": {GPU: "1"}}},
    ),
    Case(
        "GPU requests '2' equal limits 2 (string vs integer)",
        {f"{C0}.resources": {"requests": {GPU: "2"}, "limits": {GPU: 2}}},
    ),
    Case(
        "fractional cpu and binary-suffix memory",
        {
            f"{C0}.resources": {
                "requests": {"cpu": "0.5", "memory": "1.5Gi"},
                "limits": {"cpu": 2, "memory": "2Gi"},
            }
        },
    ),
    Case("restartPolicy Never spelt out", {f"{TS}.restartPolicy": "Never"}),
    Case(
        "queueName and a matching template label",
        {
            "spec.scheduling": {"queueName": "team-a"},
            "spec.template.metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        },
    ),
    Case(
        "priorityClassName in both places, equal",
        {
            "spec.scheduling": {"priorityClassName": PRIORITY_CLASS},
            f"{TS}.priorityClassName": PRIORITY_CLASS,
        },
    ),
    Case(
        "checkpoint on a dotted PVC name and its own mountPath",
        {"spec.checkpoint": {"pvc": {"claimName": "ck.v1", "mountPath": "/ckpt"}}},
    ),
    Case(
        "own volumes, and an own dshm mounted at /dev/shm",
        {
            f"{TS}.volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            ],
            f"{C0}.volumeMounts": [
                {"name": "data", "mountPath": "/data"},
                {"name": "dshm", "mountPath": "/dev/shm"},
            ],
        },
    ),
    Case(
        "env with valueFrom and a dotted name",
        {
            f"{C0}.env": [
                {"name": "my.var", "value": "1"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ]
        },
    ),
    Case(
        "an init container",
        {f"{TS}.initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}]},
    ),
    Case("nprocPerNode at its bound", {"spec.nprocPerNode": 1024}, replicas=1),
    Case(
        "exit codes at the bounds, backoff initial == max, factor 1",
        {
            "spec.failurePolicy": {
                "maxRestarts": 10000,
                "permanentExitCodes": [1],
                "retryableExitCodes": [255],
                "backoff": {"initialSeconds": 60, "maxSeconds": 60, "factor": 1},
            }
        },
    ),
    Case(
        "deadline at int64 max and ttl at int32 max (a common 'never'), as a Job accepts",
        {
            "spec.runPolicy": {
                "activeDeadlineSeconds": 2**63 - 1,
                "ttlSecondsAfterFinished": 2**31 - 1,
            }
        },
    ),
    # --- no stricter than Kubernetes (issue 17): what a Pod/Service/Job accepts, we do -------
    Case("name starts with a digit (a v1.37 Service accepts it)", {}, name="3d-unet"),
    Case(
        "schedulerName with a space (Pods do not constrain it)",
        {"spec.scheduling": {"schedulerName": "my scheduler"}},
    ),
    Case(
        "300 env entries (was refused over 256), 100 envFrom, 100 ports, 40 imagePullSecrets",
        {
            f"{C0}.env": [{"name": f"V{i}", "value": str(i)} for i in range(300)],
            f"{C0}.envFrom": [
                {"configMapRef": {"name": f"cm-{i}", "optional": True}} for i in range(100)
            ],
            f"{C0}.ports": [{"containerPort": 1000 + i} for i in range(100)],
            f"{TS}.imagePullSecrets": [{"name": f"pull-{i}"} for i in range(40)],
        },
    ),
    Case(
        "prefixed label keys and annotations",
        {
            "spec.template.metadata": {
                "labels": {"example.com/team": "ml_research.v2"},
                "annotations": {"example.com/note": "free text: with spaces"},
            }
        },
    ),
    Case("elastic with min == max", {"spec.elastic": {"minReplicas": 2, "maxReplicas": 2}}),
    Case(
        "named port in a probe (int-or-string)",
        {
            f"{C0}.ports": [{"name": "http", "containerPort": 8080}],
            f"{C0}.livenessProbe": {"httpGet": {"path": "/", "port": "http"}},
        },
    ),
    Case(
        "tolerations, nodeSelector and affinity",
        {
            f"{TS}.tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            f"{TS}.nodeSelector": {"type": "kwok"},
            f"{TS}.affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "type", "operator": "In", "values": ["kwok"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
    ),
]


def _api_message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body).get("message", err.body))
    except (TypeError, ValueError):
        return str(err.body)


@pytest.fixture(scope="module")
def admission_ns(core_v1: Any, crd: None) -> Iterator[str]:
    name = "t-admission"
    try:
        core_v1.delete_namespace(name)
        k.wait_for(
            lambda: name not in {n.metadata.name for n in core_v1.list_namespace().items},
            60,
            "old namespace gone",
        )
    except ApiException as e:
        if e.status != 404:
            raise
    core_v1.create_namespace({"metadata": {"name": name, "labels": {"torchjob.io/test": "true"}}})
    try:
        yield name
    finally:
        core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def custom(kube: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def _create(
    custom: client.CustomObjectsApi, ns: str, body: dict[str, Any], dry_run: bool = True
) -> Any:
    return custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        body,
        dry_run="All" if dry_run else None,
        field_validation="Strict",
    )


def test_the_table_is_big_enough() -> None:
    assert len(INVALID) + len(UPDATES) + len(UPDATES_WITH_CHECKPOINT) >= 60
    assert len(VALID) >= 15
    assert len({case.reason for case in [*INVALID, *VALID]}) == len(INVALID) + len(VALID)


@pytest.mark.parametrize("case", INVALID, ids=[x.reason for x in INVALID])
def test_invalid_manifest_is_rejected_with_a_message_naming_the_field(
    case: Case, custom: client.CustomObjectsApi, admission_ns: str
) -> None:
    with pytest.raises(ApiException) as err:
        _create(custom, admission_ns, case.manifest())
    assert err.value.status in (400, 422), err.value.body
    message = _api_message(err.value)
    assert case.message in message, f"{case.reason}: {message}"


def test_invalid_updates_are_rejected(custom: client.CustomObjectsApi, admission_ns: str) -> None:
    plain = base("upd-plain", replicas=2)
    with_ck = base("upd-ck", replicas=2)
    with_ck["spec"]["checkpoint"] = {"path": "/ck"}
    for body in (plain, with_ck):
        _create(custom, admission_ns, body, dry_run=False)
    for name, cases in (("upd-plain", UPDATES), ("upd-ck", UPDATES_WITH_CHECKPOINT)):
        for reason, patch, expected in cases:
            with pytest.raises(ApiException) as err:
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, admission_ns, PLURAL, name, patch, dry_run="All"
                )
            assert expected in _api_message(err.value), f"{reason}: {_api_message(err.value)}"
    # The scale subresource runs the same rules: kubectl scale beyond elastic bounds.
    elastic = base("upd-elastic")
    elastic["spec"]["elastic"] = {"minReplicas": 1, "maxReplicas": 4}
    _create(custom, admission_ns, elastic, dry_run=False)
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object_scale(
            GROUP,
            VERSION,
            admission_ns,
            PLURAL,
            "upd-elastic",
            {"spec": {"replicas": 9}},
            dry_run="All",
        )
    assert "spec.replicas must lie between" in _api_message(err.value)
    # kubectl scale of a static job whose name then no longer fits its last hostname.
    _create(custom, admission_ns, base("w" * 54), dry_run=False)
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object_scale(
            GROUP,
            VERSION,
            admission_ns,
            PLURAL,
            "w" * 54,
            {"spec": {"replicas": 11}},
            dry_run="All",
        )
    assert "metadata.name is too long" in _api_message(err.value)


# (field, its default, a real change, what the job needs besides). A field written with its
# default and a field left out are the same job (GitOps tools add and drop such lines).
DEFAULTED: list[tuple[str, Any, Any, dict[str, Any]]] = [
    ("spec.nprocPerNode", 1, 2, {}),
    ("spec.backend", "auto", "gloo", {}),
    ("spec.membershipPolicy", "RecreateGroup", "KeepSurvivors", {}),
    (
        "spec.checkpoint.pvc.mountPath",
        "/checkpoints",
        "/ck",
        {"spec.checkpoint.pvc.claimName": "ck"},
    ),
    (
        "spec.runtimeRef.kind",
        "ClusterTorchRuntime",
        "TorchRuntime",
        {"spec.runtimeRef.name": "gpu"},
    ),
]


def _patch(path: str, value: Any) -> dict[str, Any]:
    """A merge patch that sets ``path`` to ``value`` (None: removes it)."""
    patch: dict[str, Any] = {}
    _set(patch, path, value)
    return patch


@pytest.mark.parametrize(
    ("path", "default", "change", "needs"), DEFAULTED, ids=[d[0] for d in DEFAULTED]
)
def test_a_default_valued_immutable_field_may_be_added_or_removed_but_not_changed(
    custom: client.CustomObjectsApi,
    admission_ns: str,
    path: str,
    default: Any,
    change: Any,
    needs: dict[str, Any],
) -> None:
    field = ".".join(path.split(".")[:2])  # the immutable field: spec.checkpoint
    stem = "dflt-" + path.rsplit(".", 1)[-1].lower()
    written, left_out = base(f"{stem}-w", replicas=1), base(f"{stem}-o", replicas=1)
    for body in (written, left_out):
        for key, value in needs.items():
            _set(body, key, value)
    _set(written, path, default)
    for body in (written, left_out):
        _create(custom, admission_ns, body, dry_run=False)

    def patch(name: str, value: Any) -> Any:
        return custom.patch_namespaced_custom_object(
            GROUP, VERSION, admission_ns, PLURAL, name, _patch(path, value), dry_run="All"
        )

    removed = patch(f"{stem}-w", None)  # re-applied without the line
    *parents, last = path.split(".")
    for key in parents:
        removed = removed[key]
    assert last not in removed, removed
    patch(f"{stem}-o", default)  # the line added
    for name in (f"{stem}-w", f"{stem}-o"):
        with pytest.raises(ApiException) as err:
            patch(name, change)
        assert err.value.status == 422, err.value.body
        assert f"{field} is immutable" in _api_message(err.value), _api_message(err.value)


def test_with_a_runtime_ref_a_default_valued_field_stays_as_written(
    custom: client.CustomObjectsApi, admission_ns: str
) -> None:
    """Left out, the field is the blueprint's, which the API server cannot see."""
    body = base("dflt-blueprint", replicas=1)
    body["spec"]["runtimeRef"] = {"name": "gpu"}
    _create(custom, admission_ns, body, dry_run=False)
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            admission_ns,
            PLURAL,
            "dflt-blueprint",
            {"spec": {"backend": "auto"}},
            dry_run="All",
        )
    assert "spec.backend is immutable" in _api_message(err.value), _api_message(err.value)


def test_typos_are_rejected_by_kubectl_apply_client_and_server_side(
    cluster: k.Cluster, admission_ns: str
) -> None:
    body = base("typo")
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "valu": "1"}]
    text = yaml.safe_dump(body)
    for mode in ([], ["--server-side"]):
        out = cluster.kubectl(
            "-n", admission_ns, "apply", *mode, "-f", "-", input=text, check=False
        )
        assert out.returncode != 0, f"kubectl apply {mode} accepted a typo"
        # Client-side apply names list items by index, server-side apply by their keys.
        assert any(
            path in out.stderr
            for path in (
                "spec.template.spec.containers[0].env[0].valu",
                'spec.template.spec.containers[name="trainer"].env[name="A"].valu',
            )
        ), out.stderr
        spec_typo = yaml.safe_dump({**base("typo2"), "spec": {**base()["spec"], "replica": 2}})
        out = cluster.kubectl(
            "-n", admission_ns, "apply", *mode, "-f", "-", input=spec_typo, check=False
        )
        assert out.returncode != 0 and "spec.replica" in out.stderr, out.stderr


def test_valid_edge_cases_are_accepted_and_get_all_their_pods(
    cluster: k.Cluster,
    kube: Any,
    custom: client.CustomObjectsApi,
    admission_ns: str,
    operator: OperatorProcess,
) -> None:
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()
    k.create_priority_class(kube, PRIORITY_CLASS, 10)  # returns once admission resolves it
    core = client.CoreV1Api(kube)
    jobs = Jobs(cluster, kube, admission_ns, operator)
    names: dict[str, Case] = {}
    for i, case in enumerate(VALID):
        name = case.name if case.name != "tj" else f"valid-{i}"
        created = _create(custom, admission_ns, case.manifest(name), dry_run=False)
        names[name] = case
        # The pod of the largest index this job can ever have must be a valid pod too. Its
        # dry run goes under a job name of the same length that is not this job's (the
        # operator may already have created a pod of this very name: 409 AlreadyExists), one
        # twin per job. The twin's ServiceAccount is owned by this job (name and uid): an
        # owner reference naming the twin, a TorchJob that does not exist, is dangling, and
        # the garbage collector deletes the account (it looks owners up by name), which made
        # the dry run below fail now and then with 403 'serviceaccount ... not found'.
        spec = TorchJobSpec.model_validate(created["spec"])
        twin = ("x" if name[0] != "x" else "y") + name[1:]
        assert twin not in names and twin != name
        uid = created["metadata"]["uid"]
        for kind, rbac in worker_rbac(name=twin, namespace=admission_ns, uid=uid):
            if kind == "ServiceAccount":
                rbac["metadata"]["ownerReferences"] = [owner_reference(name, uid)]
                try:
                    core.create_namespaced_service_account(admission_ns, rbac)
                except ApiException as e:
                    if e.status != 409:
                        raise
        last = spec.max_replicas - 1
        body = worker_pod(
            name=twin,
            namespace=admission_ns,
            uid=created["metadata"]["uid"],
            spec=spec,
            index=last,
            generation=1,
            replicas=spec.max_replicas,
        )
        assert len(body["metadata"]["name"]) == len(contract.worker_pod_name(name, last))
        k.dry_run_pod_until_admitted(core, admission_ns, body)

    def all_pods_created() -> bool:
        return all(
            len(jobs.pods(n)) == (c.pods or jobs.get(n)["spec"]["replicas"])
            for n, c in names.items()
        )

    k.wait_for(
        all_pods_created,
        60,
        lambda: (
            "pods of every valid job\n"
            + "\n".join(
                f"{n}: {len(jobs.pods(n))} pods, status {jobs.status(n).get('conditions')}"
                for n in names
            )
            + f"\n{operator.logs()}"
        ),
    )
    for n in names:
        conditions = {x["type"]: x for x in jobs.status(n).get("conditions") or []}
        assert conditions.get("Stalled", {}).get("status") != "True", (n, conditions)

    # The job's headless Service carries the job's name: a leading digit is a Service name too.
    def digit_service() -> bool:
        return any(
            s.metadata.name == "3d-unet" for s in core.list_namespaced_service(admission_ns).items
        )

    k.wait_for(digit_service, 60, lambda: f"Service 3d-unet\n{operator.logs()}")
    assert "Traceback" not in operator.log_path.read_text(errors="replace"), operator.logs(200)


def test_a_job_stored_under_a_laxer_crd_gets_invalid_spec_on_the_first_reconcile(
    cluster: k.Cluster,
    kube: Any,
    custom: client.CustomObjectsApi,
    admission_ns: str,
    operator: OperatorProcess,
) -> None:
    """The one way an accepted TorchJob can still be one the operator cannot run: it was
    stored before a stricter CRD (an upgrade). The first reconcile must say so in its
    conditions and a Warning Event, create nothing, and not crash or loop. The CRD is made
    laxer for the length of this test only (``spec.replicas`` loses its minimum)."""
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()
    zero = base("stored-under-old-crd", replicas=0)

    def server_accepts_zero_replicas() -> bool:
        try:  # a dry run under another name: the job itself exists once created
            _create(custom, admission_ns, base("zero-probe", replicas=0))
        except ApiException as e:
            if e.status != 422:
                raise
            return False
        return True

    schema = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/replicas"
    cluster.kubectl(
        "patch",
        "crd",
        "torchjobs.torchjob.io",
        "--type=json",
        "-p",
        json.dumps([{"op": "remove", "path": f"{schema}/minimum"}]),
    )
    try:
        k.wait_for(server_accepts_zero_replicas, 60, "the laxer CRD in effect", interval=0.5)
        _create(custom, admission_ns, zero, dry_run=False)
    finally:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
        k.wait_for(lambda: not server_accepts_zero_replicas(), 60, "the CRD restored", interval=0.5)
    jobs = Jobs(cluster, kube, admission_ns, operator)
    name = "stored-under-old-crd"
    status = jobs.wait(
        name,
        lambda s: s if s.get("observedGeneration") == 1 and s.get("conditions") else None,
        "the first status write of a job the operator cannot run",
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == conditions["Ready"]["reason"] == "InvalidSpec"
    assert "spec.replicas" in conditions["Stalled"]["message"], conditions["Stalled"]
    (event,) = [e for e in jobs.wait_events(name, "InvalidSpec") if e.reason == "InvalidSpec"]
    assert event.type == "Warning" and "spec.replicas" in event.message
    assert jobs.pods(name) == []
    assert "Traceback" not in operator.log_path.read_text(errors="replace"), operator.logs(200)
    custom.delete_namespaced_custom_object(GROUP, VERSION, admission_ns, PLURAL, name)
