"""The building blocks of the rule table (``torchjob.api.models.rules``): the CEL fragments
several rules share, and the Python helpers their checks call."""

from __future__ import annotations

from typing import Any

from torchjob import contract
from torchjob.api.models.limits import JOB_NAME

# --- why a rule has no Python check ------------------------------------------------------

TRANSITION = "a transition rule: it compares with the stored object (oldSelf)"
NAME = "metadata.name: it names the job's Service and pod hostnames, which only a cluster has"

# --- CEL building blocks -------------------------------------------------------------

NAME_IS_LABEL = f"self.metadata.name.matches(r'{JOB_NAME}')"
"""The name of a TorchJob or a TorchTune: a DNS label (it begins its pods' hostnames)."""
NAME_MUST = (
    "metadata.name must be a DNS label: lowercase letters, digits and '-', starting and ending "
    "with a letter or digit"
)

WORKERS = "(has(self.spec.elastic) ? self.spec.elastic.maxReplicas : self.spec.replicas)"
SUFFIX_LEN = f"({len(contract.WORKER_SUFFIX)} + size(string({WORKERS} - 1)))"
TEMPLATE_LABELS = (
    "(has(self.template) && has(self.template.metadata) && has(self.template.metadata.labels)"
    " ? self.template.metadata.labels : {})"
)
NO_TEMPLATE = "!has(self.template) || "
"""With spec.runtimeRef the template may be left out (the blueprint's is used)."""
REF = "has(self.runtimeRef) || !has(self.template) || "
"""A rule that needs the whole template: with spec.runtimeRef the API server sees only the
job's overrides; the operator checks the merged spec (``torchjob.api.merge``). Without a
template (and without runtimeRef) the rule template-or-runtime alone says so."""
IMAGE_OK = ".all(c, has(c.image) && size(c.image.trim()) > 0)"
MOUNTS_KNOWN = (
    ".all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
    "m.name == 'dshm' || (m.name == 'torchjob-checkpoint' && has(self.checkpoint) && "
    "has(self.checkpoint.pvc)) || (has(self.template.spec.volumes) && "
    "self.template.spec.volumes.exists(v, v.name == m.name))))"
)
IMMUTABLE = "is immutable while the TorchJob exists; delete and recreate the job to change it"

# --- Python helpers of the checks ------------------------------------------------------


def extra(model: Any) -> dict[str, Any]:
    return model.model_extra or {}


def labels(template: Any) -> dict[str, str]:
    return (template.metadata.labels if template.metadata else None) or {}


def both(policy: Any) -> set[int]:
    return set(policy.permanent_exit_codes or ()) & set(policy.retryable_exit_codes or ())


def agrees(given: str | None, where: dict[str, Any], key: str) -> bool:
    """``given`` unset, or ``where[key]`` absent or equal to it."""
    return not given or where.get(key, given) == given


def images(spec: Any) -> bool:
    """Every container and init container of the template names an image."""
    inits = extra(spec.template.spec).get("initContainers") or []
    return all(str(c.image or "").strip() for c in spec.template.spec.containers) and all(
        isinstance(c, dict) and str(c.get("image") or "").strip() for c in inits
    )


def mounts_known(spec: Any) -> bool:
    """Every volumeMount names a volume of the template (or dshm, or the checkpoint PVC)."""
    pod = extra(spec.template.spec)
    known = {v.get("name") for v in pod.get("volumes") or [] if isinstance(v, dict)} | {"dshm"}
    if spec.checkpoint is not None and spec.checkpoint.pvc is not None:
        known.add("torchjob-checkpoint")
    containers = [extra(c) for c in spec.template.spec.containers]
    containers += [c for c in pod.get("initContainers") or [] if isinstance(c, dict)]
    return all(
        isinstance(m, dict) and m.get("name") in known
        for c in containers
        for m in c.get("volumeMounts") or []
    )


def mount_clash(spec: Any) -> bool:
    pvc = spec.checkpoint.pvc if spec.checkpoint else None
    return pvc is not None and any(
        isinstance(m, dict) and m.get("mountPath") == pvc.mount_path
        for c in spec.template.spec.containers
        for m in extra(c).get("volumeMounts") or []
    )
