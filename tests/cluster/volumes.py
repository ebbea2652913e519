"""A PersistentVolumeClaim bound to a directory of the host, for ``spec.initializers``'
volume in the tests and the bench (bench/initializers.py): a static ``hostPath``
PersistentVolume and a claim naming it, which kube-controller-manager binds. kube-scheduler
places no pod whose claim is unbound; on the real node the kubelet mounts the directory, which
the tests read back on the host (the node shares the host's filesystem)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from tests import kube as k


def bound_claim(core: Any, namespace: str, name: str, host_dir: Path | str) -> str:
    """Create the claim ``name`` in ``namespace`` on ``host_dir`` (ReadWriteMany, 1Gi) and
    wait until it is Bound; returns the PersistentVolume's name (cluster-scoped: delete it)."""
    pv = f"tj-{name}-{uuid.uuid4().hex[:8]}"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "2Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"},
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )

    def bound() -> bool:
        claim = core.read_namespaced_persistent_volume_claim(name, namespace)
        return bool(claim.status and claim.status.phase == "Bound")

    k.wait_for(bound, 60, f"PersistentVolumeClaim {namespace}/{name} Bound")
    return pv
