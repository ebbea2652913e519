"""spec.placement through the real Kueue's Topology-Aware Scheduling (issue 42;
tests/cluster/kueue_harness.py), on 64 kwok GPU nodes labelled with a three-level topology:
2 blocks x 4 racks x 8 hosts, 8 GPUs each, tainted so that no other test's pod lands there.
Every worker asks for 8 GPUs (a whole node), so a block holds 32 workers.

Never skipped: if Kueue is not built or cannot start, the tests fail saying why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import groupby, pairwise
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k
from tests.cluster.kueue_harness import (
    KUEUE,
    KueueProcess,
    create_kueue_object,
    remove_queue,
    running_kueue,
)
from tests.cluster.operator_harness import Jobs, torchjob, worker_template

from torchjob import contract

pytestmark = pytest.mark.cluster

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
FABRIC = "torchjob.io/topology-test"
TAINT = {"key": FABRIC, "value": "true", "effect": "NoSchedule"}
TOPOLOGY = "torchjob-test-fabric"
BLOCKS, RACKS, HOSTS = 2, 4, 8


def _nodes() -> list[dict[str, Any]]:
    return [
        k.fake_node_manifest(
            f"fabric-b{b}-r{r}-h{h}",
            gpus=8,
            labels={FABRIC: "true", BLOCK: f"b{b}", RACK: f"b{b}-r{r}"},
            taints=[TAINT],
        )
        for b in range(BLOCKS)
        for r in range(RACKS)
        for h in range(HOSTS)
    ]


@pytest.fixture(scope="module")
def fabric(
    cluster: k.Cluster, kube: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueProcess]:
    """Kueue, the 64 nodes (one kubectl apply) and the Topology of their three levels."""
    core = client.CoreV1Api(kube)
    nodes = _nodes()
    names = [n["metadata"]["name"] for n in nodes]
    cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes})
    )  # fmt: skip

    def all_ready() -> bool:
        listed = core.list_node(label_selector=f"{FABRIC}=true").items
        return len(listed) == len(names) and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ())
            for n in listed
        )

    try:
        k.wait_for(all_ready, 120, "the 64 fabric nodes Ready", interval=0.5)
        with running_kueue(cluster, tmp_path_factory.mktemp("kueue-tas")) as proc:
            custom = client.CustomObjectsApi(kube)
            levels = [{"nodeLabel": level} for level in (BLOCK, RACK, HOST)]
            create_kueue_object(
                custom,
                "topologies",
                {
                    "apiVersion": "/".join(KUEUE),
                    "kind": "Topology",
                    "metadata": {"name": TOPOLOGY},
                    "spec": {"levels": levels},
                },
            )
            yield proc
    finally:
        for name in names:
            k.delete_node(core, name)
        k.wait_for(
            lambda: not core.list_node(label_selector=f"{FABRIC}=true").items,
            60,
            "the fabric nodes gone (later tests count the GPU nodes)",
            interval=0.5,
        )


@pytest.fixture
def queue(fabric: KueueProcess, kube: Any, namespace: str) -> Iterator[str]:
    """LocalQueue ``lq`` of a ClusterQueue with room for 64 workers on a TAS flavor."""
    custom = client.CustomObjectsApi(kube)
    flavor, cq = f"{namespace}-tas", f"{namespace}-cq"
    create_kueue_object(
        custom,
        "resourceflavors",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {
                "nodeLabels": {FABRIC: "true"},
                "topologyName": TOPOLOGY,
                "tolerations": [{"key": FABRIC, "operator": "Exists", "effect": "NoSchedule"}],
            },
        },
    )
    quota = {"cpu": "1000", "memory": "1Ti", "nvidia.com/gpu": "512"}
    create_kueue_object(
        custom,
        "clusterqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": n, "nominalQuota": q} for n, q in quota.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    create_kueue_object(
        custom,
        "localqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
        namespace,
    )
    yield "lq"
    remove_queue(custom, namespace, cq, flavor)


def gpu_job(name: str, replicas: int, placement: dict[str, Any]) -> dict[str, Any]:
    template = worker_template()
    template["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 8}
    body = torchjob(name, replicas=replicas, template=template, placement=placement)
    body["metadata"]["labels"] = {contract.KUEUE_QUEUE_LABEL: "lq"}
    return body


def _node_labels(jobs: Jobs, pods: list[Any]) -> dict[str, dict[str, str]]:
    """Each pod's node's labels, by pod index."""
    return {
        int(p.metadata.labels[contract.LABEL_POD_INDEX]): jobs.core.read_node(
            p.spec.node_name
        ).metadata.labels
        for p in pods
    }


def test_a_32_worker_job_is_admitted_into_one_block_with_ranks_contiguous_per_rack(
    jobs: Jobs, queue: str
) -> None:
    jobs.apply(gpu_job("wide", 32, {"required": BLOCK}))
    pods = jobs.wait_running_pods("wide", 32, generation=1, timeout=240)
    on = _node_labels(jobs, pods)
    assert len({on[i][BLOCK] for i in on}) == 1, {i: on[i][BLOCK] for i in on}
    # No status.members: rank = pod index. Walking the ranks, each rack is one run of 8.
    racks = [on[i][RACK] for i in sorted(on)]
    runs = [(rack, len(list(group))) for rack, group in groupby(racks)]
    assert [n for _, n in runs] == [8] * 4, racks
    assert len({rack for rack, _ in runs}) == 4
    # The env says each worker's domain, as its node's labels do.
    first = next(p for p in pods if p.metadata.labels[contract.LABEL_POD_INDEX] == "0")
    env = {e.name: e.value for e in first.spec.containers[0].env}
    assert json.loads(env[contract.TOPOLOGY]) == {BLOCK: on[0][BLOCK], RACK: on[0][RACK]}
    held = jobs.status("wide")["placement"]
    assert held["levels"] == [BLOCK, RACK, HOST]
    assert len(held["domains"]) == 32 and {d["values"][0] for d in held["domains"]} == {
        on[0][BLOCK]
    }


def test_a_required_level_no_domain_can_hold_stays_pending_and_says_why(
    jobs: Jobs, queue: str
) -> None:
    jobs.apply(gpu_job("huge", 40, {"required": BLOCK}))  # a block holds 32
    status = jobs.wait(
        "huge",
        lambda s: s if _ready(s).get("reason") == "TopologyUnsatisfiable" else None,
        "the Ready condition to say TopologyUnsatisfiable",
        timeout=90,
    )
    assert status["phase"] == "Suspended"
    message = _ready(status)["message"]
    assert BLOCK in message and "40 pod(s)" in message, message
    events = jobs.wait_events("huge", "TopologyUnsatisfiable")
    assert any(e.type == "Warning" for e in events if e.reason == "TopologyUnsatisfiable")
    assert jobs.pods("huge") == []


def test_a_lost_worker_regrows_in_the_same_rack_when_its_node_is_gone(
    jobs: Jobs, queue: str
) -> None:
    jobs.apply(gpu_job("rack", 4, {"required": RACK}))
    pods = jobs.wait_running_pods("rack", 4, generation=1, timeout=120)
    on = _node_labels(jobs, pods)
    rack = on[1][RACK]
    assert {on[i][RACK] for i in on} == {rack}
    # Worker 1's node goes: cordoned (no pod starts there again), and its pod deleted.
    lost = next(p for p in pods if p.metadata.labels[contract.LABEL_POD_INDEX] == "1")
    node = lost.spec.node_name
    jobs.core.patch_node(node, {"spec": {"unschedulable": True}})
    jobs.core.delete_namespaced_pod(lost.metadata.name, jobs.ns, grace_period_seconds=0)
    again = jobs.wait_running_pods("rack", 4, generation=2, timeout=120)
    now = _node_labels(jobs, again)
    assert {now[i][RACK] for i in now} == {rack}, now
    moved = next(p for p in again if p.metadata.labels[contract.LABEL_POD_INDEX] == "1")
    assert moved.spec.node_name != node
    assert jobs.status("rack").get("restarts", 0) == 0


def test_after_a_keep_survivors_loss_the_regrown_generation_ranks_each_rack_together(
    jobs: Jobs, queue: str
) -> None:
    """24 workers in one block (three racks of 8), KeepSurvivors, shrink on disruption: worker
    11 (the middle rack) is deleted; the job goes on with 23, its replacement joins in the
    middle rack, and walking the grown generation's ranks (``status.members``, or the pod
    indices) each rack is still one run: the ring crosses between racks three times, not four
    (the replacement ranked last, after the third rack, as before issue 42's fix)."""
    body = gpu_job("ring", 24, {"required": BLOCK})
    body["spec"]["membershipPolicy"] = "KeepSurvivors"
    body["spec"]["elastic"] = {"minReplicas": 8, "maxReplicas": 24, "shrinkOnDisruption": True}
    jobs.apply(body)
    pods = jobs.wait_running_pods("ring", 24, generation=1, timeout=240)
    first = 1  # the generation the pods above run in (the status may show it a moment later)
    on = _node_labels(jobs, pods)
    runs = [len(list(group)) for _, group in groupby(on[i][RACK] for i in sorted(on))]
    assert runs == [8, 8, 8], on
    lost = next(p for p in pods if p.metadata.labels[contract.LABEL_POD_INDEX] == "11")
    jobs.core.delete_namespaced_pod(lost.metadata.name, jobs.ns, grace_period_seconds=0)
    grown = jobs.wait(
        "ring",
        lambda s: (
            s
            if s.get("currentGeneration", 0) >= first + 2
            and s.get("replicas") == 24
            and s.get("phase") == "Running"
            else None
        ),
        "the job to shrink to 23 and grow back to 24",
        timeout=180,
    )
    ranks = grown.get("members") or list(range(24))
    now = _node_labels(
        jobs, jobs.wait_running_pods("ring", 24, generation=grown["currentGeneration"])
    )
    racks = [now[i][RACK] for i in ranks]
    assert sum(a != b for a, b in pairwise([*racks, racks[0]])) == 3, (ranks, racks)
    assert jobs.status("ring").get("restarts", 0) == 0


def test_a_preferred_request_spills_over_when_its_rack_is_full_and_the_condition_says_so(
    jobs: Jobs, queue: str
) -> None:
    jobs.apply(gpu_job("spill", 2, {"preferred": RACK}))
    pods = jobs.wait_running_pods("spill", 2, generation=1, timeout=120)
    placed = jobs.wait(
        "spill",
        lambda s: _condition(s, "Placed").get("status") == "True" and s,
        "Placed=True (every worker in the job's rack)",
        timeout=60,
    )
    assert _condition(placed, "Placed")["reason"] == "InDomains"
    rack = _node_labels(jobs, pods)[0][RACK]
    full = [n.metadata.name for n in jobs.core.list_node(label_selector=f"{RACK}={rack}").items]
    try:
        # The rack has no room any more (every node cordoned); a worker is lost.
        for node in full:
            jobs.core.patch_node(node, {"spec": {"unschedulable": True}})
        lost = next(p for p in pods if p.metadata.labels[contract.LABEL_POD_INDEX] == "1")
        jobs.core.delete_namespaced_pod(lost.metadata.name, jobs.ns, grace_period_seconds=0)
        again = jobs.wait_running_pods("spill", 2, generation=2, timeout=120)
        assert all(p.spec.node_name not in full for p in again)
        spilled = jobs.wait(
            "spill",
            lambda s: _condition(s, "Placed").get("reason") == "SpilledOver" and s,
            "Placed=False SpilledOver",
            timeout=60,
        )
        message = _condition(spilled, "Placed")["message"]
        assert _condition(spilled, "Placed")["status"] == "False"
        assert RACK in message and "spill-worker-" in message, message
    finally:
        for node in full:
            jobs.core.patch_node(node, {"spec": {"unschedulable": False}})


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c["type"] == type_), {})


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c["type"] == "Ready"), {})
