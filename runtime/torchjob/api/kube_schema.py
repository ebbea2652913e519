"""The core/v1 PodTemplateSpec schema of the pinned Kubernetes release, made structural.

``spec.template`` of a TorchJob is a real PodTemplateSpec, so the API server
rejects a typo in it (``valu:``, ``resource:``) under strict field validation,
as it does for a Deployment. The schema is never written by hand: it is read
from the OpenAPI v3 document that ships in the ``k8s.io/kubernetes`` Go module
of ``KUBE_VERSION`` (hack/versions.env), which ``make testbin`` puts in the Go
module cache (``go mod download k8s.io/kubernetes@<version>`` does too).

What changes on the way into the CRD, and why:

- ``$ref``/``allOf`` are inlined: a CRD schema must be structural (no refs).
- descriptions, ``x-kubernetes-patch-*``, ``x-kubernetes-unions`` are dropped
  (size; the CRD schema has no place for patch strategies).
- ``Quantity`` (``oneOf: [string, number]`` in the document) becomes
  ``x-kubernetes-int-or-string`` with Kubernetes' quantity pattern, as
  controller-gen writes it: ``nvidia.com/gpu: 8`` and ``memory: 4Gi`` both parse.
- ``IntOrString`` becomes ``x-kubernetes-int-or-string``; ``Time`` a date-time string.
- Defaults: only non-empty scalar ones (``protocol: TCP``) and those of list-map
  keys (which a structural schema needs) are kept; other ``{}`` and ``""`` are Go
  zero values, not defaults.
- ``metadata`` (of the template, and of an ephemeral volume's claim template)
  keeps ``labels`` and ``annotations`` only: the operator names its pods
  itself, so any other field could never take effect.
- ``ephemeralContainers`` cannot be set when a pod is created, so the field is
  an empty list only (its schema would be a second copy of Container's).

The list-type/map-keys annotations of the document are kept as they are, so
duplicate container, env or volume names are rejected by the schema itself.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from functools import cache
from typing import Any

PREFIX = "#/components/schemas/"
POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
MICRO_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# controller-gen's pattern for resource.Quantity (k8s.io/apimachinery/pkg/api/resource).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_KEEP = {
    "type",
    "format",
    "properties",
    "items",
    "required",
    "additionalProperties",
    "enum",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
}
_TEMPLATE_META_FIELDS = ("labels", "annotations")

Additions = dict[str, dict[str, Any]]
"""Per Kubernetes type name: schema keys to add (CEL rules, bounds), merged after inlining.
A key ``properties.<field>`` adds to that property's node instead."""


class KubeOpenAPIMissing(RuntimeError):
    """The OpenAPI document of the pinned Kubernetes release is not on this machine."""


def repo_root() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[3]


def kube_version(root: pathlib.Path | None = None) -> str:
    env = (root or repo_root()) / "hack" / "versions.env"
    for line in env.read_text().splitlines():
        if line.startswith("KUBE_VERSION="):
            return line.split("=", 1)[1].strip()
    raise KubeOpenAPIMissing(f"no KUBE_VERSION in {env}")


def _gomodcache() -> pathlib.Path:
    if os.environ.get("GOMODCACHE"):
        return pathlib.Path(os.environ["GOMODCACHE"])
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None
    )
    if go:
        try:
            out = subprocess.run(
                [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True, timeout=60
            ).stdout.strip()
            if out:
                return pathlib.Path(out)
        except (OSError, subprocess.SubprocessError):
            pass
    gopath = os.environ.get("GOPATH") or str(pathlib.Path.home() / "go")
    return pathlib.Path(gopath.split(os.pathsep)[0]) / "pkg" / "mod"


def openapi_path(version: str | None = None) -> pathlib.Path:
    """api__v1_openapi.json of k8s.io/kubernetes@<version> in the Go module cache."""
    version = version or kube_version()
    if os.environ.get("TORCHJOB_KUBE_OPENAPI"):
        path = pathlib.Path(os.environ["TORCHJOB_KUBE_OPENAPI"])
    else:
        path = (
            _gomodcache()
            / f"k8s.io/kubernetes@{version}"
            / "api/openapi-spec/v3/api__v1_openapi.json"
        )
    if not path.is_file():
        raise KubeOpenAPIMissing(
            f"the TorchJob CRD embeds the PodTemplateSpec schema of Kubernetes {version}, read "
            f"from {path}, which does not exist. Run `make testbin` (or `go mod download "
            f"k8s.io/kubernetes@{version}`), or point TORCHJOB_KUBE_OPENAPI at that file."
        )
    return path


@cache
def _load(path: str) -> dict[str, Any]:
    with open(path) as f:
        doc: dict[str, Any] = json.load(f)
    return dict(doc["components"]["schemas"])


def _ref_name(node: dict[str, Any]) -> str | None:
    if "$ref" in node:
        return str(node["$ref"]).removeprefix(PREFIX)
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        return str(all_of[0]["$ref"]).removeprefix(PREFIX)
    return None


def _merge(node: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if key.startswith("properties."):
            _merge(node["properties"][key.split(".", 1)[1]], value)
        elif key == "x-kubernetes-validations":
            node[key] = [*node.get(key, []), *value]
        else:
            node[key] = value


class _Converter:
    def __init__(self, schemas: dict[str, Any], additions: Additions) -> None:
        self.schemas = schemas
        self.additions = additions

    def named(self, name: str, stack: tuple[str, ...]) -> dict[str, Any]:
        if name in stack:
            raise ValueError(f"recursive type {' -> '.join((*stack, name))}: not structural")
        if name == QUANTITY:
            node: dict[str, Any] = {
                "x-kubernetes-int-or-string": True,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": QUANTITY_PATTERN,
            }
        elif name == INT_OR_STRING:
            node = {
                "x-kubernetes-int-or-string": True,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
            }
        elif name in (TIME, MICRO_TIME):
            node = {"type": "string", "format": "date-time"}
        else:
            node = self.node(self.schemas[name], (*stack, name))
        if name == OBJECT_META:
            node["properties"] = {k: node["properties"][k] for k in _TEMPLATE_META_FIELDS}
        if name in self.additions:
            _merge(node, self.additions[name])
        return node

    def node(self, raw: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
        ref = _ref_name(raw)
        if ref is not None:
            return self.named(ref, stack)
        out: dict[str, Any] = {k: v for k, v in raw.items() if k in _KEEP}
        if out.get("format") == "int-or-string":
            out.pop("format")
        default = raw.get("default")
        if isinstance(default, bool | int | float) or (isinstance(default, str) and default):
            out["default"] = default
        if "properties" in out:
            out["properties"] = {k: self.node(v, stack) for k, v in out["properties"].items()}
        if isinstance(out.get("items"), dict):
            out["items"] = self.node(out["items"], stack)
            # A list-map key must be required or defaulted: keep Kubernetes' default even if "".
            item_ref = _ref_name(raw["items"])
            raw_props = (self.schemas[item_ref] if item_ref else raw["items"]).get("properties", {})
            for key in out.get("x-kubernetes-list-map-keys", []):
                prop = out["items"]["properties"][key]
                if key not in out["items"].get("required", []) and "default" in raw_props[key]:
                    prop["default"] = raw_props[key]["default"]
        if isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = self.node(out["additionalProperties"], stack)
        return out


def pod_template_schema(
    additions: Additions | None = None, version: str | None = None
) -> dict[str, Any]:
    """The structural schema of core/v1 PodTemplateSpec, with ``additions`` merged per type."""
    schemas = _load(str(openapi_path(version)))
    conv = _Converter(schemas, additions or {})
    node = conv.named(POD_TEMPLATE, ())
    node["properties"]["spec"]["properties"]["ephemeralContainers"] = {
        "type": "array",
        "maxItems": 0,
        "items": {"type": "object"},
    }
    return node
