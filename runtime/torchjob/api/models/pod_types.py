"""What the CRD adds to Kubernetes' own PodTemplateSpec schema, per Kubernetes type: bounds
that keep the CEL rules within the API server's cost budget, and the rules themselves
(``POD_TYPE_RULES``, part of the rule table ``torchjob.api.models.rules.RULES``).

Keys of ``TEMPLATE_RULES`` are type names of the OpenAPI document (torchjob.api.kube_schema).
"""

from __future__ import annotations

from typing import Any

from torchjob.api.models.base import CEL
from torchjob.api.models.limits import DNS_LABEL, GPU_RESOURCE, LABEL_KEY, LABEL_VALUE
from torchjob.api.models.rule import Rule, cel_on

KUBE_FIELD = "a field of Kubernetes' pod template that the models pass through"
"""Why a rule has no Python check: pydantic keeps the template loose (its schema is Kubernetes')."""

_POD_SPEC = "io.k8s.api.core.v1.PodSpec"
_CONTAINER = "io.k8s.api.core.v1.Container"
_ENV_VAR = "io.k8s.api.core.v1.EnvVar"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

_GPU = "'nvidia.com/gpu'"
_Q = "quantity(string({v}))"
_IS_Q = "isQuantity(string({v}))"


def _nonneg(m: str) -> str:
    v = f"{m}[k]"
    return f"{m}.all(k, !{_IS_Q.format(v=v)} || !{_Q.format(v=v)}.isLessThan(quantity('0')))"


def _extra(model: Any) -> dict[str, Any]:
    return model.model_extra or {}


POD_TYPE_RULES: tuple[Rule, ...] = (
    Rule(
        "restart-policy",
        on=_POD_SPEC,
        subject="PodSpec",
        cel="!has(self.restartPolicy) || self.restartPolicy == 'Never'",
        message=(
            "spec.template.spec.restartPolicy must be Never (or left out): the operator "
            "restarts whole groups, never single ranks"
        ),
        check=lambda pod: _extra(pod).get("restartPolicy", "Never") == "Never",
    ),
    Rule(
        "hostname",
        on=_POD_SPEC,
        subject="PodSpec",
        cel="!has(self.hostname) && !has(self.subdomain)",
        message=(
            "spec.template.spec.hostname and subdomain are set by the operator "
            "(<job>-worker-<i>, <job>); remove them"
        ),
        check=lambda pod: not any(k in _extra(pod) for k in ("hostname", "subdomain")),
    ),
    Rule(
        "container-name",
        on=_CONTAINER,
        cel="size(self.name) <= 63 && self.name.matches(r'" + DNS_LABEL + "')",
        message=(
            "container name must be a DNS label: lowercase letters, digits and '-', at most "
            "63 characters, starting and ending with a letter or digit"
        ),
        field_path=".name",
        unchecked=KUBE_FIELD,
    ),
    Rule(
        "resources-not-negative",
        on=_CONTAINER,
        subject="Quantity",
        cel=(
            "!has(self.resources) || ((!has(self.resources.limits) || "
            + _nonneg("self.resources.limits")
            + ") && (!has(self.resources.requests) || "
            + _nonneg("self.resources.requests")
            + "))"
        ),
        message="resources.limits and resources.requests must not be negative",
        check=lambda q: q.value >= 0,
        explain=lambda q: f"{q.where}.{q.kind}[{q.name}] must not be negative",
    ),
    Rule(
        "gpu-whole",
        on=_CONTAINER,
        subject="Quantity",
        cel=(
            "!has(self.resources) || ("
            + " && ".join(
                f"(!has(self.resources.{m}) || !('nvidia.com/gpu' in self.resources.{m}) || "
                f"!{_IS_Q.format(v=f'self.resources.{m}[{_GPU}]')} || "
                f"{_Q.format(v=f'self.resources.{m}[{_GPU}]')}.isInteger())"
                for m in ("limits", "requests")
            )
            + ")"
        ),
        message=(
            "nvidia.com/gpu must be a whole number of GPUs (e.g. 1, 8), not a fraction such as "
            "0.5 or 500m"
        ),
        check=lambda q: q.name != GPU_RESOURCE or q.value == q.value.to_integral_value(),
    ),
    Rule(
        "gpu-requests-equal-limits",
        on=_CONTAINER,
        subject="Resources",
        cel=(
            "!has(self.resources) || !has(self.resources.limits) || "
            "!has(self.resources.requests) || !('nvidia.com/gpu' in self.resources.limits) || "
            "!('nvidia.com/gpu' in self.resources.requests) || "
            "string(self.resources.limits['nvidia.com/gpu']) == "
            "string(self.resources.requests['nvidia.com/gpu']) || ("
            + _IS_Q.format(v="self.resources.limits['nvidia.com/gpu']")
            + " && "
            + _IS_Q.format(v="self.resources.requests['nvidia.com/gpu']")
            + " && "
            + _Q.format(v="self.resources.limits['nvidia.com/gpu']")
            + ".compareTo("
            + _Q.format(v="self.resources.requests['nvidia.com/gpu']")
            + ") == 0)"
        ),
        message=(
            "resources.requests and resources.limits of nvidia.com/gpu must be equal when both "
            "are given (GPUs cannot be overcommitted); give only limits"
        ),
        check=lambda r: (
            GPU_RESOURCE not in r.limits
            or GPU_RESOURCE not in r.requests
            or r.limits[GPU_RESOURCE] == r.requests[GPU_RESOURCE]
        ),
    ),
    Rule(
        "requests-within-limits",
        on=_CONTAINER,
        subject="Resources",
        cel=(
            "!has(self.resources) || !has(self.resources.limits) || "
            "!has(self.resources.requests) || self.resources.requests.all(k, "
            "!(k in self.resources.limits) || !"
            + _IS_Q.format(v="self.resources.requests[k]")
            + " || !"
            + _IS_Q.format(v="self.resources.limits[k]")
            + " || "
            + _Q.format(v="self.resources.requests[k]")
            + ".compareTo("
            + _Q.format(v="self.resources.limits[k]")
            + ") <= 0)"
        ),
        message="resources.requests must not exceed resources.limits for any resource",
        check=lambda r: all(n not in r.limits or q <= r.limits[n] for n, q in r.requests.items()),
    ),
    Rule(
        "env-name",
        on=_ENV_VAR,
        cel="self.name.matches(r'^[ -<>-~]+$')",
        message="env name must be printable ASCII without '=' (e.g. BATCH_SIZE), and not empty",
        field_path=".name",
        unchecked=KUBE_FIELD,
    ),
    Rule(
        "labels",
        on=_META,
        field="labels",
        cel=(
            "self.all(k, size(k) <= 317 && k.matches(r'" + LABEL_KEY + "') && "
            "self[k].matches(r'" + LABEL_VALUE + "'))"
        ),
        message=(
            "labels must be valid label keys (an optional DNS prefix and '/', then at most "
            "63 letters, digits, '-', '_' or '.') with values of at most 63 such "
            "characters, beginning and ending with a letter or digit"
        ),
        unchecked=KUBE_FIELD,
    ),
    Rule(
        "annotations-size",
        on=_META,
        field="annotations",
        cel="self.map(k, size(k) + size(self[k])).sum() <= 262144",
        message="annotations may total at most 256 KiB (keys and values), as on any pod",
        unchecked=KUBE_FIELD,
    ),
)
"""The rules on Kubernetes' pod template types (their Python checks run in PodTemplateSpec)."""


TEMPLATE_RULES: dict[str, dict[str, Any]] = {
    _POD_SPEC: {
        CEL: cel_on(POD_TYPE_RULES, _POD_SPEC),
        # Bounds that keep the CEL rules below within the API server's cost budget.
        "properties.containers": {"minItems": 1, "maxItems": 16},
        "properties.initContainers": {"maxItems": 16},
        "properties.volumes": {"maxItems": 64},
        "properties.restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
        "properties.priorityClassName": {"maxLength": 253},
    },
    _CONTAINER: {
        CEL: cel_on(POD_TYPE_RULES, _CONTAINER),
        "properties.name": {"maxLength": 253},
        "properties.image": {"maxLength": 1024},
        # The env-name rule (EnvVar below) runs once per entry: at 2048 the API server refuses
        # the CRD (estimated cost 1.02x its per-rule budget), at 1024 it accepts it.
        "properties.env": {"maxItems": 1024},
        "properties.volumeMounts": {"maxItems": 64},
        "properties.imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        "properties.terminationMessagePolicy": {"enum": ["File", "FallbackToLogsOnError"]},
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"maxLength": 64},
    "io.k8s.api.core.v1.ResourceRequirements": {
        "properties.limits": {"maxProperties": 32},
        "properties.requests": {"maxProperties": 32},
    },
    _ENV_VAR: {
        CEL: cel_on(POD_TYPE_RULES, _ENV_VAR),
        "properties.name": {"maxLength": 256},
    },
    "io.k8s.api.core.v1.VolumeMount": {
        "properties.name": {"maxLength": 63},
    },
    "io.k8s.api.core.v1.Volume": {
        "properties.name": {"maxLength": 63},
    },
    _META: {
        "properties.labels": {
            "maxProperties": 64,
            "additionalProperties": {"type": "string", "maxLength": 63},
            CEL: cel_on(POD_TYPE_RULES, _META, "labels"),
        },
        "properties.annotations": {
            "maxProperties": 256,
            CEL: cel_on(POD_TYPE_RULES, _META, "annotations"),
        },
    },
}
"""CEL rules and bounds the CRD adds to Kubernetes' PodTemplateSpec schema (per type)."""
