"""The per-job ServiceAccount, Role and RoleBinding of the workers (pure builders).

Least privilege: the workers may get and patch the status of their own
TorchJob (``resourceNames``), which is how rank 0 reports progress and a survivor
reports a silent peer (a server-side apply: the same verb), and get and
watch that one TorchJob, which is how a KeepSurvivors pod follows its
generations; nothing else. Which fields of that status they may change is the chart's
admission policy's to say (``resources/worker_policy.py``): RBAC cannot. A template that
names its own ``serviceAccountName`` (for cloud storage credentials, say) keeps it; progress
is then reported only if that account is granted the same.
"""

from __future__ import annotations

from typing import Any

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL
from torchjob_operator.resources.owner import owner_reference
from torchjob_operator.resources.pods import job_labels


def _meta(name: str, namespace: str, job: str, uid: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": job_labels(job),
        "ownerReferences": [owner_reference(job, uid)],
    }


def worker_rbac(*, name: str, namespace: str, uid: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, manifest) of the ServiceAccount, Role and RoleBinding, in creation order."""
    account = contract.worker_service_account(name)
    return [
        (
            "ServiceAccount",
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": _meta(account, namespace, name, uid),
            },
        ),
        (
            "Role",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": _meta(account, namespace, name, uid),
                "rules": [
                    {
                        "apiGroups": [GROUP],
                        "resources": [f"{PLURAL}/status"],
                        "resourceNames": [name],
                        "verbs": ["get", "patch"],
                    },
                    {
                        "apiGroups": [GROUP],
                        "resources": [PLURAL],
                        "resourceNames": [name],
                        # watch: a KeepSurvivors pod follows its job with a watch of this
                        # one object (fieldSelector metadata.name), not with a poll.
                        "verbs": ["get", "watch"],
                    },
                ],
            },
        ),
        (
            "RoleBinding",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": _meta(account, namespace, name, uid),
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": account,
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
            },
        ),
    ]
