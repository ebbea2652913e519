"""The TorchTune models: what they accept, what they reject (naming the field), and that the
committed CRD is the one generated from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tests.unit.builders import torchtune

from torchjob.api import crd
from torchjob.api.crd import build_tune_crd, render_tune_crd_yaml
from torchjob.api.models import CEL, RULES, Rule
from torchjob.api.torchtune import TorchTune, TorchTuneSpec
from torchjob.api.tune_rules import TUNE_RULES

REPO = Path(__file__).resolve().parents[2]


def study(**spec: Any) -> dict[str, Any]:
    space = [{"name": "lr", "type": "loguniform", "low": 1e-4, "high": 1e-1}]
    return torchtune(space, {"name": "s"}, **{"maxTrials": 4, **spec})


def test_a_valid_study_parses_with_defaults() -> None:
    tt = TorchTune.model_validate(study())
    assert tt.spec.parallelism == 1
    assert tt.spec.sampler.type.value == "tpe"
    assert tt.spec.pruner.type.value == "none"
    assert tt.spec.trial_template.spec.replicas == 2


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"searchSpace": []}, "spec.searchSpace must list at least one parameter"),
        (
            {"searchSpace": [{"name": "x", "type": "grid", "values": [1, 2]}]},
            "spec.sampler.type must be grid",
        ),
        (
            {
                "searchSpace": [{"name": "x", "type": "uniform", "low": 0, "high": 1}],
                "sampler": {"type": "grid"},
            },
            "the grid sampler enumerates only grid and categorical",
        ),
        (
            {"searchSpace": [{"name": "x", "type": "uniform", "low": 1, "high": 0}]},
            "spec.searchSpace[].low and high",
        ),
        (
            {"searchSpace": [{"name": "x", "type": "categorical", "values": []}]},
            "values",
        ),
        (
            {"searchSpace": [{"name": "x", "type": "categorical"}]},
            "spec.searchSpace[].values must list at least one value",
        ),
        ({"pruner": {"type": "threshold"}}, "spec.pruner: a threshold pruner needs lower or upper"),
        ({"trialTemplate": {"spec": {"replicas": 0, "template": {}}}}, "replicas"),
    ],
)
def test_bad_studies_are_rejected_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        TorchTune.model_validate(study(**spec))
    assert field in str(err.value)


def test_the_trial_template_is_validated_as_a_torchjob_spec_in_the_crd() -> None:
    crd = build_tune_crd()
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    job_spec = spec["properties"]["trialTemplate"]["properties"]["spec"]
    assert job_spec["properties"]["template"]["properties"]["spec"]["required"] == ["containers"]
    assert job_spec["x-kubernetes-validations"], "the TorchJob spec's CEL rules"
    messages = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert any("spec.searchSpace must list" in m for m in messages)
    # categorical/grid without values: an OpenAPI anyOf (CEL cannot see the untyped values).
    param = spec["properties"]["searchSpace"]["items"]
    assert param["anyOf"][0] == {
        "required": ["values"],
        "properties": {"type": {"enum": ["categorical", "grid"]}},
    }
    assert crd["spec"]["names"]["shortNames"] == ["tt"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Best"] == ".status.bestValue"
    assert columns["Trials"] == ".status.progress"


def test_committed_tune_crd_is_generated_from_the_models() -> None:
    committed = (REPO / "crds" / "torchjob.io_torchtunes.yaml").read_text()
    assert committed == render_tune_crd_yaml(), "crds/ is stale: run `make crds`"
    chart = REPO / "charts" / "torchjob-operator" / "crds" / "torchjob.io_torchtunes.yaml"
    assert chart.read_text() == committed


def test_spec_round_trips_in_camel_case() -> None:
    spec = TorchTuneSpec.model_validate(study()["spec"])
    wire = spec.to_wire()
    assert wire["maxTrials"] == 4
    assert wire["trialTemplate"]["spec"]["replicas"] == 2


def test_no_category_shadows_a_resource_name() -> None:
    """kubectl expands a category before it looks up a resource: a category named like a
    resource turns ``kubectl delete torchjob x`` into a delete over every kind in it."""
    crds = [crd.build_crd(), crd.build_tune_crd()]
    names = set()
    for c in crds:
        n = c["spec"]["names"]
        names |= {n["plural"], n["singular"], n["kind"].lower(), *n["shortNames"]}
    for c in crds:
        categories = set(c["spec"]["names"]["categories"])
        assert categories == {"all", "torch"}
        assert not categories & names, categories & names


# --- the rule table (torchjob.api.tune_rules): each rule once, in the CRD and in pydantic ---

TUNE_PLACES: dict[str, tuple[str, ...]] = {
    "TorchTune": (),
    "TorchTuneSpec": ("spec",),
    "Parameter": ("spec", "searchSpace", "items"),
    "Pruner": ("spec", "pruner"),
}
GRID = [{"name": "x", "type": "grid", "values": [1, 2]}]
TUNE_EXAMPLES: dict[str, dict[str, Any]] = {
    # rule name -> a study spec that breaks it and no other rule
    "parameter-bounds": {"searchSpace": [{"name": "x", "type": "int", "low": 3, "high": 3}]},
    "parameter-log-low": {
        "searchSpace": [{"name": "x", "type": "loguniform", "low": 0, "high": 1}]
    },
    "pruner-threshold": {"pruner": {"type": "threshold"}},
    "search-space-not-empty": {"searchSpace": []},
    "grid-needs-grid-sampler": {"searchSpace": GRID},
    "grid-sampler-enumerates": {
        "searchSpace": [*GRID, {"name": "y", "type": "uniform", "low": 0, "high": 1}],
        "sampler": {"type": "grid"},
    },
    "parameter-names-unique": {"searchSpace": [GRID[0], GRID[0]], "sampler": {"type": "grid"}},
}


def _tune_root() -> dict[str, Any]:
    root: dict[str, Any] = build_tune_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def _tune_validations(node: Any, path: tuple[str, ...] = ()) -> list[Any]:
    """Every x-kubernetes-validations entry below ``node``, but the trial template's spec (a
    TorchJob spec: the TorchJob's table)."""
    if path[-3:] == ("trialTemplate", "properties", "spec"):
        return []
    if isinstance(node, list):
        return [v for item in node for v in _tune_validations(item, path)]
    if not isinstance(node, dict):
        return []
    found = list(node.get(CEL, []))
    return found + [
        v for k, item in node.items() if k != CEL for v in _tune_validations(item, (*path, k))
    ]


@pytest.mark.parametrize("rule", TUNE_RULES, ids=lambda r: r.name)
def test_every_tune_rule_is_in_the_crd_where_the_table_says(rule: Rule) -> None:
    node = _tune_root()
    for key in TUNE_PLACES[rule.on]:
        node = node[key] if key == "items" else node["properties"][key]
    assert rule.entry() in node[CEL]


def test_the_tune_crd_has_no_rule_the_table_lacks() -> None:
    in_crd = {json.dumps(v, sort_keys=True) for v in _tune_validations(_tune_root())}
    assert in_crd == {json.dumps(r.entry(), sort_keys=True) for r in TUNE_RULES}


def test_the_study_and_the_job_name_rules_share_the_name_pattern() -> None:
    study_name = next(r for r in TUNE_RULES if r.name == "study-name")
    assert study_name.cel == next(r for r in RULES if r.name == "job-name").cel


@pytest.mark.parametrize("name", sorted(TUNE_EXAMPLES))
def test_pydantic_refuses_each_tune_example_with_the_rules_message(name: str) -> None:
    assert set(TUNE_EXAMPLES) == {r.name for r in TUNE_RULES if r.check is not None}
    rule = next(r for r in TUNE_RULES if r.name == name)
    with pytest.raises(ValidationError) as err:
        TorchTune.model_validate(study(**TUNE_EXAMPLES[name]))
    assert [e["msg"] for e in err.value.errors()] == [f"Value error, {rule.message}"]
