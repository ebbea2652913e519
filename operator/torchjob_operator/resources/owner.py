"""The owner reference every object of a TorchJob carries (pods, Service, RBAC, initialisers)."""

from __future__ import annotations

from typing import Any

from torchjob.api.models import API_VERSION, KIND


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
