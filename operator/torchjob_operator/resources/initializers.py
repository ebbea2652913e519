"""Manifests of ``spec.initializers``: the pod of one initialiser, and what a worker pod gets
(the volume, mounted read-only, and ``TORCHJOB_DATASET_PATH`` / ``TORCHJOB_MODEL_PATH``).

An initialiser is a plain pod (``restartPolicy: Never``, owned by the TorchJob, labelled
with the job's name so that the operator's pod watch sees it): it runs ``torchjob
initialize`` in the runtime image on a CPU node, once. Pure functions from the spec to dicts.
"""

from __future__ import annotations

import copy
from typing import Any

from torchjob import contract
from torchjob.api.models import InitializersSpec, TorchJobSpec
from torchjob.rules import initializer as rules
from torchjob_operator.resources.owner import owner_reference

VOLUME = "torchjob-initializers"
SOURCE_VOLUME = "torchjob-source"
DEFAULT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "250m", "memory": "256Mi"}}


def initializer_pod(
    *, name: str, namespace: str, uid: str, spec: TorchJobSpec, kind: str
) -> dict[str, Any]:
    """The pod of initialiser ``kind`` (``dataset`` or ``model``) of job ``name``."""
    init = spec.initializers
    assert init is not None
    source = init.sources()[kind]
    parsed = rules.parse_uri(source.uri)
    worker = spec.template.spec.containers[0]
    target = rules.target_dir(init.volume.mount_path, kind)
    mounts: list[dict[str, Any]] = [{"name": VOLUME, "mountPath": init.volume.mount_path}]
    volumes: list[dict[str, Any]] = [
        {"name": VOLUME, "persistentVolumeClaim": {"claimName": init.volume.claim_name}}
    ]
    if parsed.scheme == "pvc":
        mounts.append({"name": SOURCE_VOLUME, "mountPath": rules.SOURCE_ROOT, "readOnly": True})
        volumes.append(
            {
                "name": SOURCE_VOLUME,
                "persistentVolumeClaim": {"claimName": parsed.root, "readOnly": True},
            }
        )
    container: dict[str, Any] = {
        "name": "initializer",
        "image": init.image or worker.image,
        "command": ["torchjob", "initialize", "--uri", source.uri, "--target", target],
        "env": [
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": contract.TERMINATION_LOG, "value": contract.DEFAULT_TERMINATION_LOG},
        ],
        "resources": copy.deepcopy(init.resources or DEFAULT_RESOURCES),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pull = (worker.model_extra or {}).get("imagePullPolicy")
    if pull and init.image is None:
        container["imagePullPolicy"] = pull
    if source.secret_name:
        container["envFrom"] = [{"secretRef": {"name": source.secret_name}}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "containers": [container],
        "volumes": volumes,
    }
    pull_secrets = (spec.template.spec.model_extra or {}).get("imagePullSecrets")
    if pull_secrets:
        pod_spec["imagePullSecrets"] = copy.deepcopy(pull_secrets)
    if init.node_selector:
        pod_spec["nodeSelector"] = dict(init.node_selector)
    if init.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(init.tolerations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": rules.pod_name(name, kind),
            "namespace": namespace,
            "labels": {
                contract.LABEL_JOB_NAME: name,
                contract.LABEL_ROLE: contract.ROLE_INITIALIZER,
                rules.LABEL_KIND: kind,
            },
            "ownerReferences": [owner_reference(name, uid)],
        },
        "spec": pod_spec,
    }


def mount_in_worker(pod_spec: dict[str, Any], init: InitializersSpec | None) -> None:
    """Give a worker pod the initialisers' volume (read-only) and their paths in the env."""
    if init is None:
        return
    volumes: list[dict[str, Any]] = pod_spec.setdefault("volumes", [])
    if not any(v.get("name") == VOLUME for v in volumes):
        volumes.append(
            {"name": VOLUME, "persistentVolumeClaim": {"claimName": init.volume.claim_name}}
        )
    paths = rules.worker_paths(init)
    for container in pod_spec["containers"]:
        mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
        if not any(m.get("mountPath") == init.volume.mount_path for m in mounts):
            mounts.append({"name": VOLUME, "mountPath": init.volume.mount_path, "readOnly": True})
        env = [e for e in container.get("env") or [] if e.get("name") not in paths]
        container["env"] = [*env, *({"name": k, "value": v} for k, v in paths.items())]
