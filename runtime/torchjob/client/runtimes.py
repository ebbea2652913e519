"""Naming a runtime blueprint from the SDK and the CLI: ``runtime="torch-gpu"`` (a
ClusterTorchRuntime) or ``runtime="TorchRuntime/team-gpu"`` (one of the job's namespace)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torchjob.api.models import RuntimeKind, RuntimeRef

_KINDS = {
    "clustertorchruntime": RuntimeKind.CLUSTER_TORCH_RUNTIME,
    "ctjrt": RuntimeKind.CLUSTER_TORCH_RUNTIME,
    "torchruntime": RuntimeKind.TORCH_RUNTIME,
    "tjrt": RuntimeKind.TORCH_RUNTIME,
}


def parse_runtime(value: str) -> RuntimeRef:
    """``NAME`` (a ClusterTorchRuntime) or ``KIND/NAME`` (kind: ClusterTorchRuntime,
    TorchRuntime, or their short names ctjrt, tjrt)."""
    kind, _, name = value.rpartition("/")
    if kind and kind.lower() not in _KINDS:
        raise ValueError(
            f"runtime {value!r}: the kind before '/' must be ClusterTorchRuntime or TorchRuntime"
        )
    chosen = _KINDS[kind.lower()] if kind else RuntimeKind.CLUSTER_TORCH_RUNTIME
    return RuntimeRef(name=name, kind=chosen)


def with_runtime(doc: Mapping[str, Any], runtime: str | RuntimeRef | None) -> dict[str, Any]:
    """A copy of the TorchJob ``doc`` whose ``spec.runtimeRef`` names ``runtime`` (``doc``
    itself, copied, when None)."""
    out = copy.deepcopy(dict(doc))
    if runtime is None:
        return out
    ref = parse_runtime(runtime) if isinstance(runtime, str) else runtime
    spec = out.setdefault("spec", {})
    spec["runtimeRef"] = ref.to_wire()
    return out


__all__ = ["parse_runtime", "with_runtime"]
