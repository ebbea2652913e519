"""Ownership of Kubernetes objects: pure, shared by the engine's cache and the controllers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid in the object's controller ownerReference (``controller: true``), or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None
