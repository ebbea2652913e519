"""The runtime blueprint CRDs (``TorchRuntime``, ``ClusterTorchRuntime``), generated from
``torchjob.api.runtimes`` as the TorchJob's is from its models (``make crds``).

The template's schema is Kubernetes' own PodTemplateSpec with the same additions as a
TorchJob's (``models.TEMPLATE_RULES``): a blueprint is checked like the template it becomes.
"""

from __future__ import annotations

from typing import Any

import yaml

from torchjob.api import kube_schema, models
from torchjob.api import runtimes as rt
from torchjob.api.crd import HEADER, _crd, _model_schema, _without_defaults

_GPU_PATH = ".spec.template.spec.containers[0].resources.limits.nvidia\\.com/gpu"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Image", "type": "string", "jsonPath": ".spec.template.spec.containers[0].image"},
    {"name": "GPUs", "type": "string", "jsonPath": _GPU_PATH, "description": "GPUs per pod"},
    {
        "name": "Procs",
        "type": "string",
        "jsonPath": ".spec.nprocPerNode",
        "description": "training processes per pod",
    },
    {
        "name": "Min",
        "type": "integer",
        "jsonPath": ".spec.elastic.minReplicas",
        "description": "elastic: fewest workers",
    },
    {
        "name": "Max",
        "type": "integer",
        "jsonPath": ".spec.elastic.maxReplicas",
        "description": "elastic: most workers",
    },
    {
        "name": "Membership",
        "type": "string",
        "jsonPath": ".spec.membershipPolicy",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _root(description: str) -> dict[str, Any]:
    spec = _without_defaults(_model_schema(rt.TorchRuntimeSpec))
    template = kube_schema.pod_template_schema(models.TEMPLATE_RULES)
    template["description"] = spec["properties"]["template"].get("description", "")
    spec["properties"]["template"] = template
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }


def build_runtime_crd(cluster: bool) -> dict[str, Any]:
    """The ClusterTorchRuntime (``cluster``) or TorchRuntime CustomResourceDefinition."""
    scope = "cluster-wide" if cluster else "namespaced"
    crd = _crd(
        kind=rt.CLUSTER_KIND if cluster else rt.KIND,
        plural=rt.CLUSTER_PLURAL if cluster else rt.PLURAL,
        singular=rt.CLUSTER_SINGULAR if cluster else rt.SINGULAR,
        short_names=rt.CLUSTER_SHORT_NAMES if cluster else rt.SHORT_NAMES,
        root=_root(
            f"A {scope} runtime blueprint: the pod template and policies a TorchJob starts "
            "from when its spec.runtimeRef names it (docs/platform.md)."
        ),
        subresources={},
        printer_columns=PRINTER_COLUMNS,
    )
    crd["spec"]["scope"] = "Cluster" if cluster else "Namespaced"
    crd["spec"]["names"]["categories"] = ["torch"]  # not "all": a blueprint is no workload
    del crd["spec"]["versions"][0]["subresources"]
    return crd


def render_runtime_crd_yaml(cluster: bool) -> str:
    return HEADER.replace("torchjob.api.models", "torchjob.api.runtimes") + str(
        yaml.safe_dump(build_runtime_crd(cluster), sort_keys=False, width=100)
    )


FILES = {
    "torchjob.io_torchruntimes.yaml": False,
    "torchjob.io_clustertorchruntimes.yaml": True,
}
"""The file name of each blueprint CRD in ``crds/`` (and the chart's copy): cluster-scoped?"""
