"""One definition of each decision (issue 29): every rule named here is defined in exactly one
module of runtime/ and operator/, the one docs/architecture.md ("Where each rule lives")
names, and no module defines a function or class of the same name elsewhere. A second copy,
even a private one with the same name, fails here; so does a rule that moved without the
table following it.

The names the issue found defined twice (``Outcome``, ``FailurePolicy``, ``ScalingPolicy``,
``FailureDecision``, ``Mode``) must stay defined once."""

from __future__ import annotations

import ast
import functools
import importlib
from collections import defaultdict
from pathlib import Path

import pytest
from tests.unit.test_layers import ROOTS, module_name

REPO = Path(__file__).resolve().parents[2]

# name -> the module that owns it
OWNERS: dict[str, str] = {
    # the job rules
    "judge_generation": "torchjob.rules.member",
    "killed_from_outside": "torchjob.rules.member",
    "decide_restart": "torchjob.rules.restart",
    "decide_failure": "torchjob.rules.failure",
    "backoff_seconds": "torchjob.rules.failure",
    "is_permanent": "torchjob.rules.failure",
    "RestartRules": "torchjob.rules.failure",
    "Counters": "torchjob.rules.generation",
    "deadline_left": "torchjob.rules.generation",
    "worker_pod_env": "torchjob.rules.worker_env",
    "parse_uri": "torchjob.rules.initializer",
    # checkpoints: one commit protocol, one RNG capture
    "CommitTarget": "torchjob.checkpoint.commit",
    "new_manifest": "torchjob.checkpoint.commit",
    "read_manifest": "torchjob.checkpoint.commit",
    "capture_rng": "torchjob.checkpoint.rng",
    "restore_rng": "torchjob.checkpoint.rng",
    # the env contract and a pod's role
    "PodEnv": "torchjob.contract",
    "pod_role": "torchjob.contract",
    "role_in": "torchjob.contract",
    # validation: one rule table
    "RULES": "torchjob.api.models.rules",
    "enforce": "torchjob.api.models.rules",
    "merge_spec": "torchjob.api.merge",
    "resolve_runtime": "torchjob_operator.torchjob.blueprint",
    # the study core
    "grid_points": "torchjob.search.space",
    "encode": "torchjob.search.space",
    "decode": "torchjob.search.space",
    "make_sampler": "torchjob.search.sampling",
    "make_pruner": "torchjob.search.sampling",
    "metric_key": "torchjob.search.metrics",
    # the operator's controllers and their shared helpers
    "plan": "torchjob_operator.torchjob.plan",
    "amend": "torchjob_operator.torchjob.amend",
    "decide_initializers": "torchjob_operator.torchjob.initializers",
    "reconcile_once": "torchjob_operator.torchjob.controller",
    "plan_study": "torchjob_operator.torchtune.plan",
    "set_condition": "torchjob_operator.common.conditions",
    "REASONS": "torchjob_operator.common.conditions",
    "Event": "torchjob_operator.common.events",
    "utcnow": "torchjob_operator.common.clock",
    "format_time": "torchjob_operator.common.clock",
    "parse_time": "torchjob_operator.common.clock",
    "controller_uid": "torchjob_operator.common.owners",
    "WorkQueue": "torchjob_operator.engine.queue",
    "Kube": "torchjob_operator.engine.kube",
}

ONCE = ("Outcome", "FailurePolicy", "ScalingPolicy", "FailureDecision", "Mode")


@functools.cache
def definitions() -> dict[str, list[str]]:
    """Every module-level (and class-level) def/class/assignment name -> the modules that
    define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for root in ROOTS.values():
        for path in sorted(root.rglob("*.py")):
            mod = module_name(path)
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    found[node.name].append(mod)
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if isinstance(t, ast.Name):
                            found[t.id].append(mod)
    return found


@pytest.mark.parametrize("name", sorted(OWNERS))
def test_each_decision_is_defined_once_where_the_table_says(name: str) -> None:
    where = definitions()[name]
    assert where == [OWNERS[name]], f"{name} is defined in {where}, expected only {OWNERS[name]}"
    assert hasattr(importlib.import_module(OWNERS[name]), name)


@pytest.mark.parametrize("name", ONCE)
def test_the_names_once_defined_twice_are_defined_once(name: str) -> None:
    assert len(definitions()[name]) <= 1, definitions()[name]


def test_every_owner_is_in_the_architecture_page() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    missing = sorted(
        {m for m in OWNERS.values() if m not in table and m.rsplit(".", 1)[0] not in table}
    )
    assert not missing, f"docs/architecture.md's rule table does not name {missing}"
