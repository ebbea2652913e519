"""Build the TorchJob CustomResourceDefinition from the pydantic models.

``make crds`` writes the result to ``crds/``; ``tests/unit/test_crd.py``
fails when the committed YAML differs, so the CRD is never edited by hand.

Pydantic emits JSON Schema (``$ref``, ``anyOf`` with ``null``, ``const``);
Kubernetes wants a *structural* OpenAPI v3 schema. ``to_structural`` bridges
the two: references are inlined, optional types lose their ``null`` branch (an ``anyOf``
whose branches name no type is a value validation and stays),
``int | str`` becomes ``x-kubernetes-int-or-string``, and models that accept
unknown fields keep them with ``x-kubernetes-preserve-unknown-fields``.

``spec.template`` is not taken from the (deliberately loose) pydantic model: it
is Kubernetes' own PodTemplateSpec schema of the pinned release
(``torchjob.api.kube_schema``) with ``models.TEMPLATE_RULES`` added, so a typo
in the template is rejected like one in a Deployment.
"""

from __future__ import annotations

from typing import Any

import yaml

from torchjob.api import kube_schema, models, tune_rules
from torchjob.api import torchtune as tune
from torchjob.api.models import rules

_DROP = {"title", "$defs"}
_VALIDATIONS = models.CEL


def _merge_validations(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if key == _VALIDATIONS and key in into:
            into[key] = [*into[key], *[v for v in value if v not in into[key]]]
        elif key not in into:
            into[key] = value


def to_structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON Schema node into a structural OpenAPI v3 node."""
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        resolved = to_structural(target, defs)
        _merge_validations(resolved, {k: v for k, v in node.items() if k not in _DROP})
        node = resolved
        # Descriptions on the referring field win over the model docstring.
        if "description" in schema:
            node["description"] = schema["description"]

    if "anyOf" in node and all("type" not in b and "$ref" not in b for b in node["anyOf"]):
        pass  # a value validation (no types in its branches): structural, kept as written
    elif "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        if len(branches) == 1:
            inner = to_structural(branches[0], defs)
            _merge_validations(inner, {k: v for k, v in node.items() if k not in _DROP})
            if "description" in node:
                inner["description"] = node["description"]
            node = inner
        elif types == {"integer", "string"}:
            node["x-kubernetes-int-or-string"] = True
        else:  # pragma: no cover - a model change that needs a decision here
            raise ValueError(f"cannot express anyOf {branches} in a structural schema")

    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", 0) is None or isinstance(node.get("default"), dict | list):
        node.pop("default", None)

    extra = node.pop("additionalProperties", None)
    if node.get("type") == "object":
        if "properties" in node:
            node["properties"] = {
                name: to_structural(sub, defs) for name, sub in node["properties"].items()
            }
            if extra is True:
                node["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict) and extra:
            node["additionalProperties"] = to_structural(extra, defs)
        elif extra is True or extra == {}:
            node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "array" and "items" in node:
        node["items"] = to_structural(node["items"], defs)
    if not node.get("type") and not node.get("x-kubernetes-int-or-string"):
        if "enum" in node:
            node["type"] = "string"
        else:  # Any
            node["x-kubernetes-preserve-unknown-fields"] = True
    for key in _DROP:
        node.pop(key, None)
    return node


def _model_schema(model: type[models._Model]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return to_structural(raw, raw.get("$defs", {}))


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": ".status.workers",
        "description": "ready/desired workers",
    },
    {
        "name": "Gen",
        "type": "integer",
        "jsonPath": ".status.currentGeneration",
        "description": "membership generation",
    },
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts",
        "description": "group restarts after failures",
    },
    {"name": "Disruptions", "type": "integer", "jsonPath": ".status.disruptions", "priority": 1},
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch", "priority": 1},
    {
        "name": "Managed-By",
        "type": "string",
        "jsonPath": ".spec.managedBy",
        "description": "the controller that runs the job, when not the torchjob operator",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


NAME_RULES: list[dict[str, Any]] = rules.cel_of("TorchJob")
"""Rules on the whole object: the job's name is part of every worker's name and hostname."""


CATEGORIES = ("all", "torch")
"""``kubectl get torch`` lists TorchJobs and TorchTunes. Never a resource's own name: kubectl
expands a category before it looks for a resource, so a category ``torchjob`` that holds two
kinds makes ``kubectl delete torchjob NAME`` fail with "you must specify only one resource"."""


def _root_schema(
    description: str, rules: list[dict[str, Any]], spec: dict[str, Any], status: dict[str, Any]
) -> dict[str, Any]:
    """A custom resource's openAPIV3Schema: the object rules, spec and status (the status
    keeps unknown fields: kopf's own bookkeeping)."""
    status["x-kubernetes-preserve-unknown-fields"] = True
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "x-kubernetes-validations": rules,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 253}},
            },
            "spec": spec,
            "status": status,
        },
    }


def _crd(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...] | list[str],
    root: dict[str, Any],
    subresources: dict[str, Any],
    printer_columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 envelope of one namespaced kind of this API group."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": subresources,
                    "additionalPrinterColumns": printer_columns,
                }
            ],
        },
    }


def _without_defaults(node: Any) -> Any:
    """``node`` with no ``default``: the API server would write a default into every stored
    job, and a value the job seems to set wins over its runtime blueprint's (spec.runtimeRef).
    The models apply the same defaults when the operator reads the job."""
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def build_crd() -> dict[str, Any]:
    """The full apiextensions.k8s.io/v1 CustomResourceDefinition."""
    spec_schema = _without_defaults(_model_schema(models.TorchJobSpec))
    # With spec.runtimeRef the template may come from the blueprint (rule template-or-runtime).
    spec_schema["required"] = [r for r in spec_schema["required"] if r != "template"]
    template = kube_schema.pod_template_schema(models.TEMPLATE_RULES)
    template["description"] = spec_schema["properties"]["template"].get("description", "")
    spec_schema["properties"]["template"] = template
    root = _root_schema(
        "TorchJob runs distributed PyTorch training on a group of worker pods.",
        NAME_RULES,
        spec_schema,
        _model_schema(models.TorchJobStatus),
    )
    return _crd(
        kind=models.KIND,
        plural=models.PLURAL,
        singular=models.SINGULAR,
        short_names=models.SHORT_NAMES,
        root=root,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        printer_columns=PRINTER_COLUMNS,
    )


HEADER = "# Generated by `make crds` from torchjob.api.models. Do not edit by hand.\n"


def render_crd_yaml() -> str:
    return HEADER + str(yaml.safe_dump(build_crd(), sort_keys=False, width=100))


TUNE_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Trials",
        "type": "string",
        "jsonPath": ".status.progress",
        "description": "finished/maxTrials",
    },
    {"name": "Running", "type": "integer", "jsonPath": ".status.trialsRunning"},
    {"name": "Pruned", "type": "integer", "jsonPath": ".status.trialsPruned"},
    {"name": "Failed", "type": "integer", "jsonPath": ".status.trialsFailed", "priority": 1},
    {"name": "Best", "type": "number", "jsonPath": ".status.bestValue"},
    {"name": "Best-Trial", "type": "string", "jsonPath": ".status.bestTrial.name", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

TUNE_NAME_RULES: list[dict[str, Any]] = tune_rules.tune_cel("TorchTune")
"""Rules on the whole TorchTune: its name begins every trial TorchJob's."""


def build_tune_crd() -> dict[str, Any]:
    """The TorchTune CustomResourceDefinition; ``spec.trialTemplate.spec`` is validated by the
    TorchJob's own spec schema (pod template and CEL rules included)."""
    spec_schema = _model_schema(tune.TorchTuneSpec)
    job_spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    trial_template = spec_schema["properties"]["trialTemplate"]
    trial_template["properties"]["spec"] = {
        **job_spec,
        "description": "A TorchJob spec: every trial is a TorchJob made from it.",
    }
    root = _root_schema(
        "TorchTune is a hyperparameter study whose trials are TorchJobs.",
        TUNE_NAME_RULES,
        spec_schema,
        _model_schema(tune.TorchTuneStatus),
    )
    return _crd(
        kind=tune.KIND,
        plural=tune.PLURAL,
        singular=tune.SINGULAR,
        short_names=tune.SHORT_NAMES,
        root=root,
        subresources={"status": {}},
        printer_columns=TUNE_PRINTER_COLUMNS,
    )


def render_tune_crd_yaml() -> str:
    return HEADER.replace("torchjob.api.models", "torchjob.api.torchtune") + str(
        yaml.safe_dump(build_tune_crd(), sort_keys=False, width=100)
    )
