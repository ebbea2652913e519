"""The rule table (torchjob.api.models.rules): each rule is written once, and both the CRD and
pydantic enforce it from there.

For every entry: its CEL is in the generated CRD, on the schema the entry names, and nothing
else in the CRD is a rule the table lacks; a rule with a Python check has an example spec that
breaks it, and pydantic refuses that example with the rule's message. Whether the API server's
CEL refuses the same things is tests/cluster/test_admission.py's part.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any, get_args

import pytest
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from tests.unit.test_api import build_crd

from torchjob.api.models import CEL, RULES, TEMPLATE_RULES, Backend, Rule, TorchJobSpec
from torchjob.api.models.rules import IMMUTABLE_FIELDS
from torchjob.api.models.transition import OPTIONAL, REQUIRED, Shape, literal, same

BY_NAME = {r.name: r for r in RULES}
CONTAINER = ("template", "spec", "containers", "items")
PLACES: dict[str, tuple[str, ...]] = {
    # Where each schema of the table sits in the CRD (below openAPIV3Schema.properties.spec;
    # TorchJob is the root).
    "TorchJob": (),
    "TorchJobSpec": ("spec",),
    "ElasticPolicy": ("spec", "elastic"),
    "FailurePolicy": ("spec", "failurePolicy"),
    "Backoff": ("spec", "failurePolicy", "backoff"),
    "CheckpointSpec": ("spec", "checkpoint"),
    "PvcSource": ("spec", "checkpoint", "pvc"),
    "InitializerVolume": ("spec", "initializers", "volume"),
    "SchedulingSpec": ("spec", "scheduling"),
    "Placement": ("spec", "placement"),
    "io.k8s.api.core.v1.PodSpec": ("spec", "template", "spec"),
    "io.k8s.api.core.v1.Container": ("spec", *CONTAINER),
    "io.k8s.api.core.v1.EnvVar": ("spec", *CONTAINER, "env", "items"),
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": ("spec", "template", "metadata"),
}


def _base() -> dict[str, Any]:
    return {"replicas": 2, "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}


def _with(path: str, value: Any, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """``body`` (default: a valid spec) with ``value`` set at the dotted ``path``."""
    body = copy.deepcopy(body or _base())
    *parents, last = path.split(".")
    node: Any = body
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return body


C0 = "template.spec.containers.0"
EXAMPLES: dict[str, tuple[dict[str, Any], str | None]] = {
    # rule name -> (a spec that breaks it and no other rule, the Python message if it names the
    # offending values; None: the rule's own message)
    "restart-policy": (_with("template.spec.restartPolicy", "Always"), None),
    "hostname": (_with("template.spec.subdomain", "s"), None),
    "resources-not-negative": (
        _with(f"{C0}.resources", {"limits": {"cpu": -1}}),
        "spec.template.spec.containers[0].resources.limits[cpu] must not be negative",
    ),
    "gpu-whole": (_with(f"{C0}.resources", {"limits": {"nvidia.com/gpu": "500m"}}), None),
    "gpu-requests-equal-limits": (
        _with(
            f"{C0}.resources", {"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 2}}
        ),
        None,
    ),
    "requests-within-limits": (
        _with(f"{C0}.resources", {"limits": {"cpu": "1"}, "requests": {"cpu": "1500m"}}),
        None,
    ),
    "elastic-bounds": (_with("elastic", {"minReplicas": 3, "maxReplicas": 2}), None),
    "backoff-order": (_with("failurePolicy.backoff", {"initialSeconds": 600}), None),
    "exit-codes-disjoint": (
        _with("failurePolicy", {"permanentExitCodes": [3, 4], "retryableExitCodes": [4, 3, 5]}),
        "exit codes [3, 4] cannot be both retryable and permanent in spec.failurePolicy",
    ),
    "pvc-claim-name": (_with("checkpoint.pvc", {"claimName": "My_PVC"}), None),
    "pvc-mount-path": (
        _with("checkpoint.pvc", {"claimName": "ck", "mountPath": "/dev/shm/"}),
        None,
    ),
    "initializer-mount-path": (
        _with(
            "initializers",
            {"volume": {"claimName": "d", "mountPath": "//"}, "dataset": {"uri": "s3://bucket/k"}},
        ),
        None,
    ),
    "checkpoint-storage": (_with("checkpoint", {}), None),
    "priority-class-name": (_with("scheduling.priorityClassName", "High"), None),
    "queue-name": (_with("scheduling.queueName", "team a"), None),
    "placement-one-level": (_with("placement", {"required": "a/rack", "preferred": "b"}), None),
    "placement-slice-pair": (_with("placement", {"required": "rack", "sliceSize": 2}), None),
    "placement-required-label": (_with("placement", {"required": "rack/"}), None),
    "placement-preferred-label": (_with("placement", {"preferred": "-rack"}), None),
    "placement-sliceLevel-label": (
        _with("placement", {"required": "a", "sliceLevel": "b c", "sliceSize": 1}),
        None,
    ),
    "placement-slice-fits": (
        _with("placement", {"required": "a", "sliceLevel": "b", "sliceSize": 3}),
        None,
    ),
    "replicas-in-bounds": (
        _with("replicas", 5, _with("elastic", {"minReplicas": 1, "maxReplicas": 4})),
        None,
    ),
    "standby-needs-keep-survivors": (
        _with("elastic", {"minReplicas": 1, "maxReplicas": 4, "standbyReplicas": 1}),
        None,
    ),
    "scheduler-name-agrees": (
        _with("scheduling.schedulerName", "volcano", _with("template.spec.schedulerName", "x")),
        None,
    ),
    "priority-class-agrees": (
        _with(
            "scheduling.priorityClassName", "high", _with("template.spec.priorityClassName", "low")
        ),
        None,
    ),
    "queue-name-agrees": (
        _with(
            "scheduling.queueName",
            "a",
            _with("template.metadata.labels", {"kueue.x-k8s.io/queue-name": "b"}),
        ),
        None,
    ),
    "reserved-labels": (_with("template.metadata.labels", {"torchjob.io/role": "x"}), None),
    "checkpoint-mount-free": (
        _with(
            f"{C0}.volumeMounts",
            [{"name": "data", "mountPath": "/checkpoints"}],
            _with(
                "template.spec.volumes",
                [{"name": "data", "emptyDir": {}}],
                _with("checkpoint.pvc", {"claimName": "ck"}),
            ),
        ),
        None,
    ),
    "container-image": (_with(f"{C0}.image", " "), None),
    "volume-mounts-known": (
        _with(f"{C0}.volumeMounts", [{"name": "data", "mountPath": "/data"}]),
        None,
    ),
}


@functools.cache
def _root() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _node(rule: Rule, root: dict[str, Any]) -> dict[str, Any]:
    node = root
    for key in PLACES[rule.on]:
        node = node[key] if key == "items" else node["properties"][key]
    return node["properties"][rule.field] if rule.field else node


def _validations(node: Any) -> list[Any]:
    """Every x-kubernetes-validations entry anywhere below ``node``."""
    if isinstance(node, list):
        return [v for item in node for v in _validations(item)]
    if not isinstance(node, dict):
        return []
    found = list(node.get(CEL, []))
    return found + [v for k, item in node.items() if k != CEL for v in _validations(item)]


def test_rule_names_are_unique_and_every_rule_has_a_check_or_a_reason() -> None:
    assert len(BY_NAME) == len(RULES)
    for rule in RULES:
        assert (rule.check is None) == bool(rule.unchecked), rule.name
    with pytest.raises(ValueError, match="either a check or why"):
        Rule("x", on="TorchJobSpec", cel="true", message="m")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_every_rule_is_in_the_crd_where_the_table_says(rule: Rule) -> None:
    assert rule.on in PLACES, f"add {rule.on} to PLACES"
    assert rule.entry() in _node(rule, _root()).get(CEL, [])


def test_the_crd_has_no_rule_the_table_lacks() -> None:
    in_crd = {json.dumps(v, sort_keys=True) for v in _validations(_root())}
    in_table = {json.dumps(r.entry(), sort_keys=True) for r in RULES}
    assert in_crd == in_table


def test_template_rules_carry_the_pod_type_rules() -> None:
    for rule in RULES:
        if rule.on.startswith("io.k8s."):
            extra = TEMPLATE_RULES[rule.on]
            node = extra[f"properties.{rule.field}"] if rule.field else extra
            assert rule.entry() in node[CEL], rule.name


def test_every_checked_rule_has_an_example() -> None:
    assert set(EXAMPLES) == {r.name for r in RULES if r.check is not None}
    TorchJobSpec.model_validate(_base())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_pydantic_refuses_each_example_with_the_rules_message(name: str) -> None:
    rule = BY_NAME[name]
    body, named = EXAMPLES[name]
    assert (named is not None) == (rule.explain is not None), (
        "an example names values iff the rule does"
    )
    with pytest.raises(ValidationError) as err:
        TorchJobSpec.model_validate(body)
    assert [e["msg"] for e in err.value.errors()] == [f"Value error, {named or rule.message}"]


def _shape(info: FieldInfo) -> Shape:
    """What "unchanged" means for a field, read from the model: its default, or the shapes of
    an optional object's fields."""
    model = next(
        (t for t in (info.annotation, *get_args(info.annotation)) if isinstance(t, type)),
        None,
    )
    if model is not None and issubclass(model, BaseModel):
        assert info.default is None, "an object field with a default: say what unchanged means"
        return {f.alias or n: _shape(f) for n, f in model.model_fields.items()}
    if info.is_required():
        return REQUIRED
    return OPTIONAL if info.default is None else info.default


def test_each_immutable_field_compares_the_defaults_the_model_applies() -> None:
    fields = {f.alias: f for f in TorchJobSpec.model_fields.values()}
    immutable = {r.name.removesuffix("-immutable") for r in RULES if r.name.endswith("-immutable")}
    assert immutable == set(IMMUTABLE_FIELDS)
    for name, shape in IMMUTABLE_FIELDS.items():
        assert shape == _shape(fields[name]), name


def test_the_effective_value_stands_in_for_a_field_left_out() -> None:
    assert same("self.backend", "oldSelf.backend", "auto") == (
        "(has(self.backend) ? self.backend : 'auto') == "
        "(has(oldSelf.backend) ? oldSelf.backend : 'auto')"
    )
    assert literal(Backend.NCCL) == "'nccl'" and literal(1) == "1" and literal("a'b") == r"'a\'b'"
    rule = BY_NAME["backend-immutable"]
    assert rule.cel.startswith("has(self.runtimeRef) ? ")  # the blueprint may set it
    assert rule.field_path == ".backend" and "spec.backend is immutable" in rule.message
