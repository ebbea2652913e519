"""One definition of each decision (issue 29): every rule named here is defined in exactly one
module of runtime/ and operator/, the one docs/architecture.md ("Where each rule lives")
names, and no module defines a function or class of the same name elsewhere. A second copy,
even a private one with the same name, fails here; so does a rule that moved without the
table following it.

Names are not enough: a renamed copy would pass. Where a decision can be played, it is played
through every launcher (``test_every_launcher_decides_what_the_rules_decide``: each loss of
``test_decisions_table.LOSSES`` through the operator's planner, ``torchjob run`` and the local
group must reach what ``classify`` and ``decide_restart`` give themselves), and the exit code
that meant "killed" in the copies (137) is written nowhere but ``torchjob.rules.loss``.

The names the issue found defined twice (``Outcome``, ``FailurePolicy``, ``ScalingPolicy``,
``FailureDecision``, ``Mode``) must stay defined once."""

from __future__ import annotations

import ast
import functools
import importlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_layers import ROOTS, module_name

REPO = Path(__file__).resolve().parents[2]

# name -> the module that owns it
OWNERS: dict[str, str] = {
    # the job rules
    "judge_generation": "torchjob.rules.member",
    "classify": "torchjob.rules.loss",
    "ElasticRules": "torchjob.rules.loss",
    "Disruption": "torchjob.rules.loss",
    "Silent": "torchjob.rules.loss",
    "STOPPED_EXIT_CODE": "torchjob.termination",
    "oom_kills": "torchjob.termination",
    "grow_back": "torchjob.rules.resize",
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
    "role_in": "torchjob.role",
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


def _the_rules_verdict(lost: Any) -> Any:
    """What ``torchjob.rules`` itself decides for a loss of ``test_decisions_table.LOSSES``: the
    one classifier over what was seen, then ``decide_restart``."""
    import signal

    from tests.unit.test_decisions_table import POLICY, Agreed

    from torchjob import contract
    from torchjob.api.models import FailurePolicy
    from torchjob.rules import Counters, ElasticRules, RestartRules, Silent, classify
    from torchjob.rules import decide_restart as decide

    seen = {
        "kill": {"signal": signal.SIGKILL},
        "oom": {"signal": signal.SIGKILL, "oom": True, "exit_code": 137},
        "silent": {"silent": Silent(9.0, "tj-worker-0")},
        "evicted": {"taken": "PreemptionByScheduler"},
        "stopped": {"exit_code": contract.STOPPED_EXIT_CODE},
        "exit": {"exit_code": lost.code},
    }[lost.how]
    loss = classify(ended=True, **seen)
    assert loss is not None
    elastic = None if lost.elastic is None else ElasticRules(*lost.elastic)
    rules = RestartRules.of(FailurePolicy.model_validate({**POLICY, **dict(lost.policy)}))
    d = decide(
        Counters(restarts=lost.restarts),
        rules,
        loss,
        workers=lost.replicas,
        elastic=elastic,
        survivors_hold_state=lost.elastic is not None,
    )
    if not d.restarts:
        return Agreed(d.verdict.value, d.counters, lost.replicas)
    return Agreed("charged" if d.charged else "disrupted", d.counters, d.workers)


def test_every_launcher_decides_what_the_rules_decide() -> None:
    from tests.unit.test_decisions_table import (
        LOSSES,
        through_the_local_group,
        through_the_operator,
        through_torchjob_run,
    )

    for name, (lost, _) in sorted(LOSSES.items()):
        rules = _the_rules_verdict(lost)
        for launcher in (through_the_operator, through_torchjob_run, through_the_local_group):
            got = launcher(lost)
            assert got in (None, rules), (
                f"{name}: {launcher.__name__} decided {got}, the rules {rules}"
            )


def test_no_module_but_the_loss_model_knows_what_exit_code_137_means() -> None:
    """The copies of the loss model spelled SIGKILL as a bare 137 (``hard_loss``, ``silent``)."""
    found = []
    for root in ROOTS.values():
        for path in sorted(root.rglob("*.py")):
            if module_name(path) == "torchjob.rules.loss":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value == 137:
                    found.append(f"{module_name(path)}:{node.lineno}")
    assert not found, f"exit code 137 decided outside torchjob.rules.loss: {found}"
