"""Nodes that announce their end, and nodes that stop reporting, against the real control
plane (kwok nodes): the operator's Node watch (``engine/nodewatch.py``) and what the planner
does with their pods (``torchjob/nodes.py``, ``torchjob/drain.py``)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob, worker_template

from torchjob import contract
from torchjob_operator.common.clock import parse_time

pytestmark = pytest.mark.cluster

SPOT_ITN = "aws-node-termination-handler/spot-itn"
GEN = contract.LABEL_GENERATION


def _unschedulable(pod: Any) -> bool:
    """The scheduler tried and found no node (``PodScheduled=False``, ``Unschedulable``)."""
    conds = pod.status.conditions or []
    return not pod.spec.node_name and any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in conds
    )


@contextlib.contextmanager
def noticed(core: Any, node: str, key: str = SPOT_ITN) -> Iterator[None]:
    """What AWS Node Termination Handler does on a spot interruption notice: a NoSchedule
    taint on the node (no drain here: the test checks what happens before one). Removed
    after."""
    taints = list(core.read_node(node).spec.taints or [])
    mine = client.V1Taint(key=key, value="spot-itn-test", effect="NoSchedule")
    core.patch_node(node, {"spec": {"taints": [k.taint_dict(t) for t in [*taints, mine]]}})
    try:
        yield
    finally:
        now = [t for t in core.read_node(node).spec.taints or [] if t.key != key]
        core.patch_node(node, {"spec": {"taints": [k.taint_dict(t) for t in now] or None}})


def elastic(name: str, **extra: Any) -> dict[str, Any]:
    return torchjob(
        name,
        replicas=2,
        membershipPolicy="KeepSurvivors",
        elastic={"minReplicas": 1, "maxReplicas": 2, "shrinkOnDisruption": True},
        failurePolicy={"maxRestarts": 0},
        **extra,
    )


def test_a_notice_replaces_the_pod_on_another_node_before_the_node_goes(jobs: Jobs) -> None:
    """A spot interruption notice (AWS NTH's taint) on the node of worker 1, with no drain
    yet: the operator creates the replacement at once, on another node, while worker 1 still
    runs; once it is Ready it takes worker 1's place in one generation (no shrink), counted
    as a disruption, never a failure; worker 1 is then deleted, before its node goes."""
    jobs.apply(elastic("notice"))
    pods = {p.metadata.name: p for p in jobs.wait_running_pods("notice", 2, generation=0)}
    jobs.wait_phase("notice", "Running")
    node = pods["notice-worker-1"].spec.node_name
    with noticed(jobs.core, node):
        status = jobs.wait(
            "notice",
            lambda s: s if s.get("currentGeneration") == 1 else None,
            "the replacement in the noticed pod's place",
        )
        assert status["members"] == [0, 2] and status["replicas"] == 2
        assert (status["disruptions"], status["restarts"]) == (1, 0)
        assert (status["history"][-1]["cause"], status["losses"]) == ("Notice", {"Notice": 1})
        replacement = jobs.core.read_namespaced_pod("notice-worker-2", jobs.ns)
        assert replacement.spec.node_name != node, "never on the noticed node"
        reasons = jobs.wait_events(
            "notice",
            "CreatedJoiner",
            "ReplacingBeforeLeaving",
            "ReplacedBeforeLeaving",
            "KeptOffNodes",
        )
        assert "ShrunkAfterDisruption" not in {e.reason for e in reasons}
        kept = next(e for e in reasons if e.reason == "KeptOffNodes")
        assert f"{node} (termination notice {SPOT_ITN})" in kept.message, kept.message
        leaving = next(e for e in reasons if e.reason == "ReplacingBeforeLeaving")
        assert f"notice-worker-1 (node {node}: {SPOT_ITN}" in leaving.message, leaving.message
        # No longer a member: it goes now, not when its node does.
        assert k.wait_for_pod_gone(jobs.core, jobs.ns, "notice-worker-1", timeout=60)
        after = jobs.wait_running_pods("notice", 2, generation=1)
        assert {p.metadata.name for p in after} == {"notice-worker-0", "notice-worker-2"}
        assert pods["notice-worker-0"].metadata.uid in {p.metadata.uid for p in after}
        # Its two members on two nodes: `kubectl describe` says the spread is even.
        spread = jobs.wait(
            "notice",
            lambda s: next((c for c in s.get("conditions") or () if c["type"] == "Spread"), None),
            "the Spread condition",
        )
        assert (spread["status"], spread["reason"]) == ("True", "EvenlySpread"), spread
        for p in after:
            assert f"{p.spec.node_name} 1" in spread["message"], spread
        named = set(re.split(r"[ ,;]+", spread["message"]))
        assert node not in named, "a noticed node is no place to move to"


def test_a_long_notice_creates_the_replacement_its_lead_before_the_deadline(jobs: Jobs) -> None:
    """A 120 s notice (AWS NTH's taint) on a job whose replacement lead is 100 s: the operator
    says when the replacement will be created (``status.leavingWorkers[].replaceAt``, the
    deadline less the lead; Event ``ReplacingLater``), creates it no sooner, and then swaps it
    in as for any notice."""
    spec = elastic("later")
    spec["spec"]["elastic"]["replacementLeadSeconds"] = 100
    jobs.apply(spec)
    pods = {p.metadata.name: p for p in jobs.wait_running_pods("later", 2, generation=0)}
    jobs.wait_phase("later", "Running")
    node = pods["later-worker-1"].spec.node_name
    with noticed(jobs.core, node):
        leaving = jobs.wait(
            "later",
            lambda s: (s.get("leavingWorkers") or [None])[0],
            "the noticed pod in status.leavingWorkers",
        )
        deadline, replace_at = parse_time(leaving["deadline"]), parse_time(leaving["replaceAt"])
        assert deadline is not None and replace_at is not None, leaving
        assert (deadline - replace_at).total_seconds() == pytest.approx(100, abs=1), leaving
        told = next(
            e for e in jobs.wait_events("later", "ReplacingLater") if e.reason == "ReplacingLater"
        )
        assert "later-worker-1 (node" in told.message and "100 s before it goes" in told.message
        status = jobs.wait(
            "later",
            lambda s: s if s.get("currentGeneration") == 1 else None,
            "the replacement in the noticed pod's place",
        )
        assert status["members"] == [0, 2], status
        assert (status["disruptions"], status["restarts"]) == (1, 0), status
        replacement = jobs.core.read_namespaced_pod("later-worker-2", jobs.ns)
        assert replacement.metadata.creation_timestamp >= replace_at, "created no sooner"
        assert replacement.spec.node_name != node, "never on the noticed node"


def test_a_job_measures_its_replacement_lead_from_its_own_replacements(jobs: Jobs) -> None:
    """No lead in the spec: the first notice, with nothing measured yet, starts the replacement
    at once; the next notice, on the node of that replacement, is given the lead its start
    measured (1.5 x its creation-to-Ready + 30 s, from the pod as the API server keeps it)."""
    jobs.apply(elastic("measured"))
    pods = {p.metadata.name: p for p in jobs.wait_running_pods("measured", 2, generation=0)}
    jobs.wait_phase("measured", "Running")
    with noticed(jobs.core, pods["measured-worker-1"].spec.node_name):
        jobs.wait(
            "measured",
            lambda s: s if s.get("currentGeneration") == 1 else None,
            "the first replacement in the noticed pod's place",
        )
    replacement = jobs.core.read_namespaced_pod("measured-worker-2", jobs.ns)
    became = next(c for c in replacement.status.conditions if c.type == "Ready")
    start = (became.last_transition_time - replacement.metadata.creation_timestamp).total_seconds()
    with noticed(jobs.core, replacement.spec.node_name):
        leaving = jobs.wait(
            "measured",
            lambda s: next(
                (w for w in s.get("leavingWorkers") or () if w["pod"] == "measured-worker-2"),
                None,
            ),
            "the replacement, noticed in its turn, in status.leavingWorkers",
        )
        assert leaving.get("replaceAt"), leaving
        deadline, replace_at = parse_time(leaving["deadline"]), parse_time(leaving["replaceAt"])
        assert deadline is not None and replace_at is not None
        lead = (deadline - replace_at).total_seconds()
        assert lead == pytest.approx(1.5 * start + 30, abs=1.5), (lead, start)
        jobs.wait_events("measured", "ReplacingLater")


def test_a_job_that_does_not_replace_before_leaving_moves_off_a_noticed_node(
    jobs: Jobs,
) -> None:
    """A RecreateGroup job cannot train on through a notice: it restarts at once, while the
    node is still there (its pods' deletion is their SIGTERM: they stop at a checkpoint),
    and the new generation starts on other nodes. A disruption, not a failure."""
    jobs.apply(torchjob("recreate", replicas=2, failurePolicy={"maxRestarts": 0}))
    pods = jobs.wait_running_pods("recreate", 2, generation=0)
    jobs.wait_phase("recreate", "Running")
    node = pods[1].spec.node_name
    with noticed(jobs.core, node):
        status = jobs.wait(
            "recreate",
            lambda s: s if s.get("currentGeneration", 0) >= 1 else None,
            "a new generation after the notice",
        )
        assert (status["disruptions"], status["restarts"]) == (1, 0)
        again = jobs.wait_running_pods("recreate", 2, generation=status["currentGeneration"])
        assert node not in {p.spec.node_name for p in again}, "off the noticed node"


def test_a_node_that_stops_reporting_loses_its_pod_at_once(jobs: Jobs) -> None:
    """The node of worker 1 reports NotReady: the pods' default tolerations would keep them
    Running for 300 s, but the operator's Node watch sees the node and the job goes on with
    the survivor at once (a disruption), then grows back with a replacement elsewhere."""
    jobs.apply(elastic("silent-node"))
    pods = {p.metadata.name: p for p in jobs.wait_running_pods("silent-node", 2, generation=0)}
    jobs.wait_phase("silent-node", "Running")
    node = pods["silent-node-worker-1"].spec.node_name
    k.make_node_not_ready(jobs.core, node)
    try:
        status = jobs.wait(
            "silent-node",
            lambda s: s if s.get("disruptions", 0) >= 1 else None,
            "the lost pod's disruption",
            timeout=60,
        )
        assert status["restarts"] == 0
        assert status["losses"] == {"NodeLost": 1}, status.get("history")
        # Smaller at once (members absent: pods 0..replicas-1), unless already grown back.
        assert status["replicas"] == 1 or status["currentGeneration"] >= 2, status
        grown = jobs.wait(
            "silent-node",
            lambda s: s if s.get("replicas") == 2 and s.get("currentGeneration", 0) >= 2 else None,
            "grown back to 2 with the replacement",
        )
        ranked = grown.get("members") or [0, 1]
        assert ranked[0] == 0, "the survivor kept rank 0"
        fresh = jobs.wait_running_pods("silent-node", 2, generation=grown["currentGeneration"])
        by_name = {p.metadata.name: p for p in fresh}
        assert by_name["silent-node-worker-0"].metadata.uid == (
            pods["silent-node-worker-0"].metadata.uid
        ), "the survivor was never restarted"
        new = [p for n, p in by_name.items() if n != "silent-node-worker-0"]
        assert new[0].spec.node_name != node, "the replacement avoids the silent node"
        disrupted = jobs.wait_events("silent-node", "ShrunkAfterDisruption")
        said = next(e for e in disrupted if e.reason == "ShrunkAfterDisruption")
        assert "NodeLost" in said.message, said.message
    finally:
        k.restore_node_ready(jobs.core, node, untaint=True)


def test_a_pod_stuck_terminating_on_a_lost_node_does_not_hold_the_restart(jobs: Jobs) -> None:
    """A RecreateGroup job loses the node of worker 1; the pod, deleted, stays Terminating
    (a finalizer stands for the dead kubelet that never confirms it). The job restarts
    without waiting for it: its second place is created as worker 2 on another node."""
    jobs.apply(torchjob("stuck", replicas=2, failurePolicy={"maxRestarts": 0}))
    pods = {p.metadata.name: p for p in jobs.wait_running_pods("stuck", 2, generation=0)}
    jobs.wait_phase("stuck", "Running")
    node = pods["stuck-worker-1"].spec.node_name
    jobs.core.patch_namespaced_pod(
        "stuck-worker-1", jobs.ns, {"metadata": {"finalizers": [k.HOLD]}}
    )
    k.make_node_not_ready(jobs.core, node)
    try:
        status = jobs.wait(
            "stuck",
            lambda s: s if s.get("members") == [0, 2] and s.get("phase") == "Running" else None,
            "generation 1 running as pods 0 and 2",
            timeout=90,
        )
        assert (status["disruptions"], status["restarts"]) == (1, 0)
        held = jobs.core.read_namespaced_pod("stuck-worker-1", jobs.ns)
        assert held.metadata.deletion_timestamp is not None, "still terminating meanwhile"
        fresh = jobs.core.read_namespaced_pod("stuck-worker-2", jobs.ns)
        assert fresh.spec.node_name != node
        assert status["activeWorkers"] == 2, "the stuck pod is not counted"
    finally:
        k.release_held(jobs.core, jobs.ns, "stuck-worker-1")
        k.restore_node_ready(jobs.core, node, untaint=True)


GKE = "cloud.google.com/impending-node-termination"  # a 30 s notice


def report_first_step(jobs: Jobs, name: str, generation: int) -> None:
    """Rank 0's report of ``generation``'s first step, as its runtime writes it."""
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    progress = {"step": 5, "generation": generation, "updateTime": now, "firstStepTime": now}
    body = json.dumps({"status": {"progress": progress}})
    jobs.kubectl("patch", f"tj/{name}", "--subresource=status", "--type=merge", "-p", body)


def test_a_leaver_stuck_terminating_keeps_no_formed_generation_from_draining(
    jobs: Jobs, cluster: k.Cluster
) -> None:
    """bench/results/2026-12-02e notice30-2: a notice's replacement is not Ready by the
    notice's margin, so the loss makes it a member; the leaver, deleted, stays Terminating
    (its node vanished: a finalizer stands for that here). Every place of the generation has
    its pod (the member and the pending joiner), so it counts as created at once, without
    waiting for the leaver (bench/results/2026-12-05g +442 s: waiting, it could not drain), and
    the next notice is drained, the member training on while its replacement starts (before
    the fix: a full restart at once, every member deleted)."""
    a, b, c = cluster.gpu_nodes(jobs.core)[:3]
    only = {"key": "kubernetes.io/hostname", "operator": "In", "values": [a, b, c]}
    apart = {"matchLabels": {contract.LABEL_JOB_NAME: "lag"}}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [only]}]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": apart, "topologyKey": "kubernetes.io/hostname"}
            ]
        },
    }
    jobs.core.patch_node(c, {"spec": {"unschedulable": True}})  # the replacement waits
    try:
        # No room to shrink: the loss is replaced at full size, the pending joiner taking the place.
        fixed = {"minReplicas": 2, "maxReplicas": 2, "shrinkOnDisruption": True}
        body = elastic("lag", template=worker_template(affinity=affinity))
        body["spec"]["elastic"] = fixed
        jobs.apply(body)
        pods = {p.metadata.name: p for p in jobs.wait_running_pods("lag", 2, generation=0)}
        jobs.wait_phase("lag", "Running")
        jobs.core.patch_namespaced_pod(
            "lag-worker-1", jobs.ns, {"metadata": {"finalizers": [k.HOLD]}}
        )
        first, second = pods["lag-worker-0"].spec.node_name, pods["lag-worker-1"].spec.node_name
        with noticed(jobs.core, second, GKE):
            # Its replacement is Pending (the one free node cordoned) when the notice's
            # margin comes: the loss makes it a member in the leaver's place.
            status = jobs.wait(
                "lag",
                lambda s: (
                    s
                    if (s.get("currentGeneration"), s.get("createdGeneration")) == (1, 1)
                    else None
                ),
                "generation 1 created with the pending replacement in the leaver's place",
                timeout=90,
            )
            assert status.get("members") == [0, 2], status
            # The leaver is deleted in that pass or the next; held by its finalizer, it
            # terminates for as long as the test holds it, and the generation stays created.
            k.wait_for_pod(
                jobs.core,
                jobs.ns,
                "lag-worker-1",
                lambda p: p.metadata.deletion_timestamp is not None,
                what="the leaver deleted (and held terminating)",
            )
            again = jobs.status("lag")
            assert (again.get("currentGeneration"), again.get("createdGeneration")) == (1, 1), again
            jobs.core.patch_node(c, {"spec": {"unschedulable": False}})
            jobs.wait_running_pods("lag", 2, generation=1)
            report_first_step(jobs, "lag", 1)
            with noticed(jobs.core, first, GKE):
                leaving = jobs.wait(
                    "lag",
                    lambda s: (
                        s
                        if "lag-worker-0" in {w["pod"] for w in s.get("leavingWorkers") or ()}
                        else None
                    ),
                    "lag-worker-0 given notice and training on",
                )
                assert leaving["currentGeneration"] == 1, leaving
                assert (leaving["restarts"], leaving["phase"]) == (0, "Running"), leaving
                member = jobs.core.read_namespaced_pod("lag-worker-0", jobs.ns)
                assert member.metadata.deletion_timestamp is None, "not restarted"
                jobs.wait_events("lag", "CreatedJoiner", "ReplacingBeforeLeaving")
    finally:
        jobs.core.patch_node(c, {"spec": {"unschedulable": False}})
        k.release_held(jobs.core, jobs.ns, "lag-worker-1")


def test_pods_kept_off_a_node_that_returns_are_made_again(jobs: Jobs, cluster: k.Cluster) -> None:
    """Every node a job may use noticed at once (here: its one node, by nodeSelector): the
    restarted pods are created kept off it and cannot be scheduled. The notice lifted, the
    node back under its own name, their affinity would keep them Pending for good (a pod's
    affinity is immutable: bench/results/2026-11-30m); the operator deletes and makes them
    again, in the same generation, and they run there."""
    node = cluster.gpu_nodes(jobs.core)[0]
    pinned = worker_template(nodeSelector={"kubernetes.io/hostname": node})
    jobs.apply(torchjob("back", replicas=2, template=pinned, failurePolicy={"maxRestarts": 0}))
    first = {p.metadata.uid for p in jobs.wait_running_pods("back", 2, generation=0)}
    jobs.wait_phase("back", "Running")
    with noticed(jobs.core, node):
        status = jobs.wait(
            "back",
            lambda s: s if s.get("currentGeneration", 0) >= 1 else None,
            "a new generation after the notice",
        )
        generation = status["currentGeneration"]

        def kept_off() -> list[Any] | None:
            mine = str(generation)
            pods = [p for p in jobs.pods("back") if p.metadata.labels[GEN] == mine]
            stuck = [p for p in pods if _unschedulable(p)]
            return stuck if len(stuck) == 2 else None

        stuck = k.wait_for(
            kept_off,
            60,
            # The status's history says why each generation began (a second generation here
            # was kwok deleting the new pods by name: hack/kwok/pod-delete-uid.patch).
            lambda: (
                f"both new pods of generation {generation} unschedulable, kept off the "
                f"node\n{jobs.describe('back')}"
            ),
        )
        terms = stuck[0].spec.affinity.node_affinity
        required = terms.required_during_scheduling_ignored_during_execution
        assert node in {f.values[0] for f in required.node_selector_terms[0].match_fields}
    held = {p.metadata.uid for p in stuck}
    again = jobs.wait_running_pods("back", 2, generation=generation, timeout=60)
    assert not {p.metadata.uid for p in again} & (first | held), "made again, not kept"
    assert {p.spec.node_name for p in again} == {node}
    status = jobs.wait_phase("back", "Running")
    assert status["currentGeneration"] == generation, jobs.describe("back")
    assert (status["disruptions"], status["restarts"]) == (1, 0), jobs.describe("back")
    assert status.get("placingAgain") is None
    said = jobs.wait_events("back", "PlacingAgain")
    placed = next(e for e in said if e.reason == "PlacingAgain")
    assert f"kept off {node}," in placed.message, placed.message


def test_the_api_server_takes_a_pod_kept_off_several_nodes(jobs: Jobs) -> None:
    """Two nodes noticed and two suspected at once: the pod the operator builds must be one the
    API server accepts (a metadata.name field requirement takes a single value; a list of two
    made every create of the job's pods fail with 422)."""
    from torchjob_operator.resources.pods import avoid_nodes, prefer_other_nodes

    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kept-off"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    avoid_nodes(body, ["n-1", "n-2"])
    prefer_other_nodes(body, ["n-3", "n-4"])
    made = jobs.core.create_namespaced_pod(jobs.ns, body, dry_run="All")
    affinity = made.spec.affinity.node_affinity
    (term,) = affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert sorted(f.values[0] for f in term.match_fields) == ["n-1", "n-2"]
    (preferred,) = affinity.preferred_during_scheduling_ignored_during_execution
    assert sorted(f.values[0] for f in preferred.preference.match_fields) == ["n-3", "n-4"]
