"""The rule table: every CEL rule of the TorchJob CRD, each with its Python check.

One entry per rule (``Rule``): the CEL expression, where the CRD carries it, the message, and
the check pydantic runs, or why there is none (a transition rule, or a Kubernetes field the
models pass through). ``cel_of`` gives a schema its ``x-kubernetes-validations``; ``enforce``
is what the model validators call. ``tests/unit/test_rule_table.py`` checks that every entry is
in the generated CRD and that pydantic refuses an example that breaks each checked rule.
"""

from __future__ import annotations

import re
from typing import Any

from torchjob import contract
from torchjob.api.models import choices
from torchjob.api.models.limits import (
    DNS_SUBDOMAIN,
    LABEL_VALUE,
    MAX_NPROC_PER_NODE,
    RESERVED_LABELS,
)
from torchjob.api.models.placement import PLACEMENT_RULES
from torchjob.api.models.pod_types import POD_TYPE_RULES
from torchjob.api.models.rule import Rule, cel_on, enforce_rules
from torchjob.api.models.rule_parts import (
    IMAGE_OK,
    MOUNTS_KNOWN,
    NAME,
    NAME_IS_LABEL,
    NAME_MUST,
    NO_TEMPLATE,
    REF,
    SUFFIX_LEN,
    TEMPLATE_LABELS,
    agrees,
    both,
    extra,
    images,
    labels,
    mount_clash,
    mounts_known,
)
from torchjob.api.models.runtime_ref import RuntimeRef
from torchjob.api.models.transition import OPTIONAL, REQUIRED, Shape, immutable, literal

UNMOUNTABLE = ("", "/dev/shm")
"""Paths (without trailing slashes) no volume may be mounted at: / and the pods' shared memory."""

IMMUTABLE_FIELDS: dict[str, Shape] = {
    "nprocPerNode": choices.NPROC_PER_NODE,
    "backend": choices.BACKEND,
    "membershipPolicy": choices.MEMBERSHIP_POLICY,
    "checkpoint": {
        "path": OPTIONAL,
        "pvc": {"claimName": REQUIRED, "mountPath": choices.CHECKPOINT_MOUNT_PATH},
    },
    "runtimeRef": {"name": REQUIRED, "kind": RuntimeRef.model_fields["kind"].default},
    "managedBy": choices.MANAGED_BY,
}
"""The spec's immutable fields and what "unchanged" means for each (``transition``): the
effective values are compared, a default standing in where a field is left out."""

JOB_ONLY = ("runtimeRef", "managedBy")
"""Immutable fields a runtime blueprint cannot set."""

RULES: tuple[Rule, ...] = (
    # --- the whole object ---
    Rule(
        "job-name",
        on="TorchJob",
        cel=NAME_IS_LABEL,
        message=(
            f"{NAME_MUST} (it names the job's Service and is part of every pod's hostname); "
            "e.g. resnet-v2 instead of resnet.v2"
        ),
        unchecked=NAME,
    ),
    Rule(
        "job-name-length",
        on="TorchJob",
        cel=f"size(self.metadata.name) + {SUFFIX_LEN} <= 63",
        message=(
            "metadata.name is too long: every pod hostname <name>-worker-<index> must fit in 63 "
            "characters for the largest index the job can have (spec.replicas - 1, or "
            "spec.elastic.maxReplicas - 1); shorten the name (54 characters fit 10 workers, "
            "53 fit 100)"
        ),
        unchecked=NAME,
    ),
    *POD_TYPE_RULES,
    *PLACEMENT_RULES,
    # --- the spec's own blocks ---
    Rule(
        "elastic-bounds",
        on="ElasticPolicy",
        cel="self.minReplicas <= self.maxReplicas",
        message="spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas",
        check=lambda e: e.min_replicas <= e.max_replicas,
    ),
    Rule(
        "backoff-order",
        on="Backoff",
        cel=(
            "(has(self.initialSeconds) ? self.initialSeconds : 10) <= "
            "(has(self.maxSeconds) ? self.maxSeconds : 300)"
        ),
        message=(
            "spec.failurePolicy.backoff.initialSeconds must not exceed maxSeconds (maxSeconds "
            "caps every delay; raise it or lower initialSeconds)"
        ),
        check=lambda b: b.initial_seconds <= b.max_seconds,
    ),
    Rule(
        "exit-codes-disjoint",
        on="FailurePolicy",
        cel=(
            "!has(self.retryableExitCodes) || !has(self.permanentExitCodes) || "
            "self.retryableExitCodes.all(c, !(c in self.permanentExitCodes))"
        ),
        message="an exit code cannot be both retryable and permanent in spec.failurePolicy",
        check=lambda f: not both(f),
        explain=lambda f: (
            f"exit codes {sorted(both(f))} cannot be both retryable and permanent in "
            "spec.failurePolicy"
        ),
    ),
    Rule(
        "pvc-claim-name",
        on="PvcSource",
        field="claimName",
        cel=f"self.matches(r'{DNS_SUBDOMAIN}')",
        message=(
            "spec.checkpoint.pvc.claimName must be a PersistentVolumeClaim name: lowercase "
            "letters, digits, '-' and '.', at most 253 characters, starting and ending with a "
            "letter or digit"
        ),
        check=lambda p: re.match(DNS_SUBDOMAIN, p.claim_name),
    ),
    Rule(
        "pvc-mount-path",
        on="PvcSource",
        field="mountPath",
        cel="self.startsWith('/') && !self.matches('^/dev/shm/*$')",
        message=(
            "spec.checkpoint.pvc.mountPath must be an absolute path other than /dev/shm (the "
            "operator mounts shared memory there)"
        ),
        check=lambda p: p.mount_path.startswith("/") and p.mount_path.rstrip("/") != "/dev/shm",
    ),
    Rule(
        "initializer-mount-path",
        on="InitializerVolume",
        field="mountPath",
        cel="self.startsWith('/') && !self.matches('^(/dev/shm)?/*$')",
        message=(
            "spec.initializers.volume.mountPath must be an absolute path other than / and "
            "/dev/shm (the operator mounts shared memory there)"
        ),
        check=lambda v: (
            v.mount_path.startswith("/") and v.mount_path.rstrip("/") not in UNMOUNTABLE
        ),
    ),
    Rule(
        "checkpoint-storage",
        on="CheckpointSpec",
        cel="has(self.path) || has(self.pvc)",
        message=(
            "spec.checkpoint needs a path (local path or fsspec URL such as s3://bucket/dir) or "
            "a pvc"
        ),
        check=lambda c: c.path is not None or c.pvc is not None,
    ),
    Rule(
        "priority-class-name",
        on="SchedulingSpec",
        field="priorityClassName",
        cel=f"self.matches(r'{DNS_SUBDOMAIN}')",
        message=(
            "spec.scheduling.priorityClassName must be a PriorityClass name: lowercase letters, "
            "digits, '-' and '.', at most 253 characters, starting and ending with a letter or "
            "digit"
        ),
        check=lambda s: (
            s.priority_class_name is None or re.match(DNS_SUBDOMAIN, s.priority_class_name)
        ),
    ),
    Rule(
        "queue-name",
        on="SchedulingSpec",
        field="queueName",
        cel=f"self.matches(r'{LABEL_VALUE}')",
        message=(
            f"spec.scheduling.queueName must be a valid label value (it becomes the "
            f"{contract.KUEUE_QUEUE_LABEL} label): at most 63 letters, digits, '-', '_' or '.', "
            "beginning and ending with a letter or digit"
        ),
        check=lambda s: s.queue_name is None or re.match(LABEL_VALUE, s.queue_name),
    ),
    # --- the spec's fields ---
    Rule(
        "nproc-per-node",
        on="TorchJobSpec",
        field="nprocPerNode",
        cel=(
            f"type(self) == int ? self >= 1 && self <= {MAX_NPROC_PER_NODE} : "
            "self in ['gpu', 'auto']"
        ),
        message=(
            f"spec.nprocPerNode must be an integer from 1 to {MAX_NPROC_PER_NODE}, 'gpu' (one "
            "process per requested GPU) or 'auto'"
        ),
        unchecked="the field's type is the Python check (an int in bounds, 'gpu' or 'auto')",
    ),
    *(
        immutable(field, shape, from_blueprint=field not in JOB_ONLY)
        for field, shape in IMMUTABLE_FIELDS.items()
    ),
    # --- across the spec ---
    Rule(
        "template-or-runtime",
        on="TorchJobSpec",
        cel="has(self.template) || has(self.runtimeRef)",
        message=(
            "spec.template is required (the workers' pod template), unless spec.runtimeRef "
            "names a runtime blueprint that has one"
        ),
        field_path=".template",
        unchecked=(
            "TorchJobSpec requires the template; a spec with runtimeRef is merged with its "
            "blueprint first (torchjob.api.merge), and the merge says what is missing"
        ),
    ),
    Rule(
        "container-image",
        on="TorchJobSpec",
        cel=(
            f"{REF}(self.template.spec.containers{IMAGE_OK} && "
            "(!has(self.template.spec.initContainers) || "
            f"self.template.spec.initContainers{IMAGE_OK}))"
        ),
        message="container image is required (e.g. image: ghcr.io/org/train:1.0)",
        check=lambda s: s.runtime_ref is not None or images(s),
    ),
    Rule(
        "replicas-in-bounds",
        on="TorchJobSpec",
        cel=(
            "!has(self.elastic) || (self.replicas >= self.elastic.minReplicas && "
            "self.replicas <= self.elastic.maxReplicas)"
        ),
        message=(
            "spec.replicas must lie between spec.elastic.minReplicas and spec.elastic.maxReplicas"
        ),
        check=lambda s: (
            not s.elastic or s.elastic.min_replicas <= s.replicas <= s.elastic.max_replicas
        ),
    ),
    Rule(
        "standby-needs-keep-survivors",
        on="TorchJobSpec",
        cel=(
            "!has(self.elastic) || !has(self.elastic.standbyReplicas) || "
            "self.elastic.standbyReplicas == 0 || "
            f"(has(self.membershipPolicy) && self.membershipPolicy == '{contract.KEEP_SURVIVORS}')"
        ),
        message=(
            "spec.elastic.standbyReplicas needs spec.membershipPolicy KeepSurvivors (a standby "
            "joins the survivors' group; RecreateGroup recreates every pod)"
        ),
        check=lambda s: (
            not s.elastic
            or not s.elastic.standby_replicas
            or s.membership_policy == contract.KEEP_SURVIVORS
        ),
    ),
    Rule(
        "scheduler-name-agrees",
        on="TorchJobSpec",
        cel=(
            f"{NO_TEMPLATE}!has(self.scheduling) || !has(self.scheduling.schedulerName) || "
            "!has(self.template.spec.schedulerName) || "
            "self.template.spec.schedulerName == self.scheduling.schedulerName"
        ),
        message=(
            "spec.scheduling.schedulerName and spec.template.spec.schedulerName differ; set one "
            "of them"
        ),
        check=lambda s: agrees(
            s.scheduling.scheduler_name, extra(s.template.spec), "schedulerName"
        ),
    ),
    Rule(
        "priority-class-agrees",
        on="TorchJobSpec",
        cel=(
            f"{NO_TEMPLATE}!has(self.scheduling) || !has(self.scheduling.priorityClassName) || "
            "!has(self.template.spec.priorityClassName) || "
            "self.template.spec.priorityClassName == self.scheduling.priorityClassName"
        ),
        message=(
            "spec.scheduling.priorityClassName and spec.template.spec.priorityClassName differ; "
            "set one of them"
        ),
        check=lambda s: agrees(
            s.scheduling.priority_class_name, extra(s.template.spec), "priorityClassName"
        ),
    ),
    Rule(
        "queue-name-agrees",
        on="TorchJobSpec",
        cel=(
            "!has(self.scheduling) || !has(self.scheduling.queueName) || "
            f"!('{contract.KUEUE_QUEUE_LABEL}' in {TEMPLATE_LABELS}) || "
            f"{TEMPLATE_LABELS}['{contract.KUEUE_QUEUE_LABEL}'] == self.scheduling.queueName"
        ),
        message=(
            f"spec.scheduling.queueName and the template's {contract.KUEUE_QUEUE_LABEL} label "
            "differ; set one of them"
        ),
        check=lambda s: agrees(
            s.scheduling.queue_name, labels(s.template), contract.KUEUE_QUEUE_LABEL
        ),
    ),
    Rule(
        "reserved-labels",
        on="TorchJobSpec",
        subject="PodTemplateSpec",
        cel=f"!{list(RESERVED_LABELS)!r}.exists(k, k in {TEMPLATE_LABELS})".replace('"', "'"),
        message=(
            "spec.template.metadata.labels must not set torchjob.io/job-name, torchjob.io/role, "
            "torchjob.io/pod-index or torchjob.io/generation: the operator sets them on every "
            "worker"
        ),
        check=lambda t: not any(k in labels(t) for k in RESERVED_LABELS),
    ),
    Rule(
        "volume-mounts-known",
        on="TorchJobSpec",
        cel=(
            f"{REF}(self.template.spec.containers{MOUNTS_KNOWN} && "
            f"(!has(self.template.spec.initContainers) || "
            f"self.template.spec.initContainers{MOUNTS_KNOWN}))"
        ),
        message=(
            "every volumeMount in spec.template.spec.containers and initContainers must name a "
            "volume of spec.template.spec.volumes (dshm is the operator's /dev/shm; "
            "torchjob-checkpoint needs spec.checkpoint.pvc)"
        ),
        check=lambda s: s.runtime_ref is not None or mounts_known(s),
    ),
    Rule(
        "checkpoint-mount-free",
        on="TorchJobSpec",
        cel=(
            f"{NO_TEMPLATE}!has(self.checkpoint) || !has(self.checkpoint.pvc) || "
            "self.template.spec.containers.all(c, !has(c.volumeMounts) || "
            "c.volumeMounts.all(m, m.mountPath != (has(self.checkpoint.pvc.mountPath) ? "
            f"self.checkpoint.pvc.mountPath : {literal(choices.CHECKPOINT_MOUNT_PATH)})))"
        ),
        message=(
            "spec.checkpoint.pvc.mountPath is already a mountPath in the template; pick another "
            "mountPath or remove that volumeMount"
        ),
        check=lambda s: not mount_clash(s),
    ),
)
"""Every rule, in the order each schema lists its rules and each validator checks them."""


def cel_of(on: str, field: str = "") -> list[Any]:
    """The ``x-kubernetes-validations`` of ``on`` (or of its property ``field``)."""
    return cel_on(RULES, on, field)


def enforce(subject: str, obj: object) -> None:
    """Raise the first rule on ``subject`` that ``obj`` breaks (``ValueError``, its message)."""
    enforce_rules(RULES, subject, obj)
