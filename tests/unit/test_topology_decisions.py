"""spec.placement: the Workload's topology request, Kueue's topologyAssignment read back, each
pod in its domain with ranks along the topology, regrowth in the job's own domains, and the
pod affinity without Kueue (torchjob_operator/torchjob/topology.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from tests.unit.builders import at, job, pod, running
from tests.unit.test_kueue_planner import ADMITTED, WAITING, gated, ready

from torchjob import contract
from torchjob.api.models import Placement, TorchJobSpec
from torchjob.api.runtimes import TorchRuntimeSpec
from torchjob_operator.torchjob import kueue, topology
from torchjob_operator.torchjob.plan import JobView, plan, with_state
from torchjob_operator.torchjob.writes import decide

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", topology.HOSTNAME
LEVELS = [BLOCK, RACK, HOST]


def _individual(values: list[str], prefix: str = "") -> dict[str, Any]:
    return {"individual": {"roots": values, **({"prefix": prefix} if prefix else {})}}


def _assignment(racks: dict[str, int], block: str = "b1") -> dict[str, Any]:
    """Kueue's compressed v1beta2 form: one slice, one host per pod, ``racks`` pods per rack,
    in Kueue's order (sorted by the values at every level)."""
    hosts = sorted((r, f"{r}-h{i}") for r, n in racks.items() for i in range(n))
    return {
        "levels": LEVELS,
        "slices": [
            {
                "domainCount": len(hosts),
                "valuesPerLevel": [
                    {"universal": block},
                    _individual([r.removeprefix("rack") for r, _ in hosts], prefix="rack"),
                    _individual([h for _, h in hosts]),
                ],
                "podCounts": {"universal": 1},
            }
        ],
    }


def _placed(placement: dict[str, Any], replicas: int = 8, **kw: Any) -> JobView:
    view = job().replicas(replicas).build()
    spec = TorchJobSpec.model_validate({**view.spec.to_wire(), "placement": placement, **kw})
    return replace(view, spec=spec)


def _gate(ta: dict[str, Any]) -> kueue.Gate:
    return replace(ADMITTED, topology=topology.assignment_of(ta))


def test_the_request_is_kueues_topology_request_and_joins_the_workload_hash() -> None:
    p = TorchJobSpec.model_validate(
        {
            **job().build().spec.to_wire(),
            "placement": {"required": BLOCK, "sliceLevel": RACK, "sliceSize": 2},
        }
    ).placement
    assert p is not None
    assert topology.topology_request(p) == {
        "required": BLOCK,
        "podSetSliceRequiredTopology": RACK,
        "podSetSliceSize": 2,
        "podIndexLabel": contract.LABEL_POD_INDEX,
    }
    pref = Placement(preferred=RACK)
    assert topology.topology_request(pref) == {
        "preferred": RACK,
        "podIndexLabel": contract.LABEL_POD_INDEX,
    }
    worker = {"metadata": {}, "spec": {"containers": [{"name": "t"}]}}
    common: dict[str, Any] = dict(
        name="tj", namespace="ns", uid="u", queue="q", count=2, worker=worker,
        priority_class=None, priority=None,
    )  # fmt: skip
    plain = kueue.desired_workload(**common)
    asked = kueue.desired_workload(**common, topology=topology.topology_request(p))
    assert "topologyRequest" not in plain["spec"]["podSets"][0]
    assert asked["spec"]["podSets"][0]["topologyRequest"]["required"] == BLOCK
    assert not kueue.matches(plain, asked)  # a new request makes a new Workload
    # A job without a request keeps the hash it had before placement existed.
    assert plain["metadata"]["annotations"][kueue.SPEC_HASH] == kueue.spec_hash(
        2, kueue._pod_set_template(worker), None
    )


def test_the_placement_rules_name_the_field() -> None:
    base = job().build().spec.to_wire()
    with pytest.raises(ValidationError, match="exactly one of required or preferred"):
        TorchJobSpec.model_validate({**base, "placement": {}})
    with pytest.raises(ValidationError, match=r"sliceSize must not exceed spec\.replicas"):
        TorchJobSpec.model_validate(
            {**base, "placement": {"required": BLOCK, "sliceLevel": RACK, "sliceSize": 3}}
        )
    # A blueprint carries one too (merged field by field like the rest of the spec).
    bp = TorchRuntimeSpec.model_validate({"placement": {"preferred": RACK}})
    assert bp.placement is not None and bp.placement.level == RACK


def test_the_assignment_is_decoded_in_kueues_order() -> None:
    ta = topology.assignment_of(_assignment({"rack1": 2, "rack2": 1}))
    assert ta is not None
    assert ta.levels == tuple(LEVELS)
    assert [d.values for d in ta.domains] == [
        ("b1", "rack1", "rack1-h0"),
        ("b1", "rack1", "rack1-h1"),
        ("b1", "rack2", "rack2-h0"),
    ]
    counts = {"levels": [RACK], "slices": [
        {"domainCount": 2, "valuesPerLevel": [_individual(["r1", "r2"])],
         "podCounts": {"individual": [3, 1]}},
    ]}  # fmt: skip
    two = topology.assignment_of(counts)
    assert two is not None and two.slots == (("r1",), ("r1",), ("r1",), ("r2",))
    assert topology.assignment_of({"levels": [RACK], "slices": [{"domainCount": 1}]}) is None


def _hosts_only(hosts: list[str]) -> topology.Assignment:
    ta = topology.assignment_of(
        {
            "levels": [HOST],
            "slices": [
                {
                    "domainCount": len(hosts),
                    "valuesPerLevel": [_individual(hosts)],
                    "podCounts": {"universal": 1},
                }
            ],
        }
    )
    assert ta is not None and topology.host_only(ta)
    return ta


def test_a_host_only_assignment_gets_its_levels_from_the_nodes_once() -> None:
    """Kueue names only the hosts when the Topology ends at kubernetes.io/hostname: the
    other levels come from the nodes, read once and then from status.placement."""
    ta = _hosts_only(["n1", "n2"])
    assert topology.host_selector(ta) == f"{HOST} in (n1,n2)"
    nodes = {"n1": {BLOCK: "b1", RACK: "r1"}, "n2": {BLOCK: "b1", RACK: "r2"}}
    full = topology.complete(ta, LEVELS, nodes)
    assert [d.values for d in full.domains] == [("b1", "r1", "n1"), ("b1", "r2", "n2")]
    held = topology.held(full)
    assert topology.from_held(ta, held) == full
    # Another admission (other hosts) is read again.
    assert topology.from_held(_hosts_only(["n1", "n3"]), held) is None
    # A node that is gone keeps its host only; the pod is then pinned to nothing but it.
    gone = topology.complete(ta, LEVELS, {"n1": nodes["n1"]})
    assert gone.domains[1].values == ("", "", "n2")
    pod = topology.pin({"spec": {"containers": [{"name": "t"}]}}, LEVELS, gone.domains[1].values)
    assert pod["spec"]["nodeSelector"] == {}


def test_ranks_are_contiguous_per_rack_and_each_pod_is_pinned_to_its_domain() -> None:
    view = gated(_placed({"required": BLOCK}), _gate(_assignment({"rack1": 4, "rack2": 4})))
    decided = decide(view, "uid", [], [], at(0))
    racks = [w["spec"]["nodeSelector"][RACK] for w in decided.workers]
    ranks = [int(w["metadata"]["labels"][contract.LABEL_POD_INDEX]) for w in decided.workers]
    assert ranks == list(range(8))  # no status.members: rank = pod index
    assert racks == ["rack1"] * 4 + ["rack2"] * 4
    first = decided.workers[0]
    assert first["spec"]["nodeSelector"][BLOCK] == "b1"
    # The host is a preference: a replacement may start on another node of the rack.
    assert HOST not in first["spec"]["nodeSelector"]
    pref = first["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert pref[0]["preference"]["matchExpressions"] == [
        {"key": HOST, "operator": "In", "values": ["rack1-h0"]}
    ]
    env = {e["name"]: e.get("value") for e in first["spec"]["containers"][0]["env"]}
    assert json.loads(env[contract.TOPOLOGY]) == {BLOCK: "b1", RACK: "rack1"}
    assert contract.topology_of({contract.TOPOLOGY: env[contract.TOPOLOGY]})[RACK] == "rack1"
    assert decided.plan.status["placement"]["levels"] == LEVELS
    assert decided.plan.status["placement"]["domains"][0] == {
        "values": ["b1", "rack1", "rack1-h0"],
        "workers": 1,
    }


def test_a_replacement_regrows_in_its_own_domain_then_the_first_with_room() -> None:
    ta = topology.assignment_of(_assignment({"rack1": 2, "rack2": 2}))
    assert ta is not None
    key = [topology.domain_key(d.values) for d in ta.domains]
    # Pod 1 is lost: its slot is free again, it goes back there.
    assert topology.place(ta, [1], [key[0], key[2], key[3]]) == {1: ta.domains[1].values}
    # A new index beyond the admission (a replacement under a new index) takes the free slot.
    assert topology.place(ta, [7], [key[0], key[1], key[3]]) == {7: ta.domains[2].values}
    # No room anywhere: its own slot, where it waits (the documented rule).
    assert topology.place(ta, [5], key) == {5: ta.domains[1].values}


def test_a_lost_pod_regrows_in_the_same_rack_through_the_planner() -> None:
    gate = _gate(_assignment({"rack1": 2, "rack2": 2}))
    view = gated(_placed({"required": BLOCK}, replicas=4), gate)
    first = decide(view, "uid", [], [], at(0))
    labels = [w["metadata"]["labels"] for w in first.workers]
    pods = [running(replace(pod(i), domain=labels[i][topology.DOMAIN_LABEL])) for i in range(4)]
    view = with_state(view, first.plan.status)
    # Pod 2 (rack2) is gone; the group restarts in a new generation and comes back whole.
    lost = decide(view, "uid", [p for p in pods if p.index != 2], [], at(1))
    view = with_state(view, lost.plan.status)
    again = decide(view, "uid", [], [], at(100))
    racks = {int(w["metadata"]["labels"][contract.LABEL_POD_INDEX]): w for w in again.workers}
    assert racks[2]["spec"]["nodeSelector"][RACK] == "rack2"


def test_a_preferred_level_only_prefers_the_domain_so_a_replacement_can_spill_over() -> None:
    view = gated(_placed({"preferred": RACK}, replicas=2), _gate(_assignment({"rack1": 2})))
    w0 = decide(view, "uid", [], [], at(0)).workers[0]
    assert not w0["spec"].get("nodeSelector")
    aff = w0["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {e["key"]: e["values"] for e in aff[0]["preference"]["matchExpressions"]} == {
        BLOCK: ["b1"],
        RACK: ["rack1"],
        HOST: ["rack1-h0"],
    }


def test_a_required_level_no_domain_can_hold_says_so() -> None:
    pending = replace(
        WAITING,
        pending="couldn't assign flavors to pod set workers: topology \"t\" doesn't allow to "
        "fit any of 40 pod(s)",
    )
    decided = plan(gated(_placed({"required": BLOCK}, replicas=40), pending), [], at(0))
    assert decided.create is None
    cond = ready(decided.status)
    assert cond["reason"] == "TopologyUnsatisfiable"
    assert BLOCK in cond["message"] and "40 pod(s)" in cond["message"]
    assert any(e.reason == "TopologyUnsatisfiable" and e.type == "Warning" for e in decided.events)
    # A plain quota wait says Kueue's words too, under the reason it always had.
    quota = replace(WAITING, pending="insufficient unused quota for cpu in flavor f")
    waiting = ready(plan(gated(job().build(), quota), [], at(0)).status)
    assert waiting["reason"] == "WaitingForAdmission" and "insufficient" in waiting["message"]


def test_the_gate_reads_the_topology_assignment_and_kueues_pending_message() -> None:
    wl = {
        "metadata": {"name": "torchjob-tj"},
        "status": {
            "conditions": [{"type": "Admitted", "status": "True"}],
            "admission": {
                "podSetAssignments": [
                    {
                        "name": kueue.POD_SET,
                        "flavors": {"cpu": "f"},
                        "topologyAssignment": _assignment({"rack1": 1}),
                    }
                ]
            },
        },
    }
    gate = kueue.gate_of(wl, {"f": {}})
    assert gate.topology is not None and gate.topology.slots == (("b1", "rack1", "rack1-h0"),)
    held = {"status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                       "message": "no room"}]}}  # fmt: skip
    assert kueue.gate_of(held, {}).pending == "no room"


def test_without_kueue_the_request_is_pod_affinity() -> None:
    view = _placed({"required": RACK, "sliceLevel": HOST, "sliceSize": 2}, replicas=4)
    decided = decide(view, "uid", [], [], at(0))
    w3 = decided.workers[3]
    terms = w3["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["topologyKey"] == RACK
    assert terms[0]["labelSelector"]["matchLabels"][contract.LABEL_JOB_NAME] == "tj"
    assert terms[1]["topologyKey"] == HOST
    assert w3["metadata"]["labels"][topology.SLICE_LABEL] == "1"
    assert decided.plan.status.get("placement") is None
    pref = decide(_placed({"preferred": RACK}), "uid", [], [], at(0)).workers[0]
    soft = pref["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert soft[0]["weight"] == 100 and soft[0]["podAffinityTerm"]["topologyKey"] == RACK


def test_a_malformed_topology_env_names_the_variable() -> None:
    assert contract.topology_of({}) == {}
    with pytest.raises(ValueError, match=contract.TOPOLOGY):
        contract.topology_of({contract.TOPOLOGY: "[1]"})


def _elastic(placement: dict[str, Any], **view: Any) -> JobView:
    b = job().replicas(4).elastic(2, 4)
    b.spec["elastic"].update(scaleDownAfterSeconds=30, scaleUpCooldownSeconds=60)
    base = b.build()
    spec = TorchJobSpec.model_validate({**base.spec.to_wire(), "placement": placement})
    return replace(base, spec=spec, **view)


def _shrunk_out_of_the_last_two(view: JobView) -> tuple[JobView, list[Any]]:
    """Workers 2 and 3 cannot be scheduled: the job shrinks to 2 and runs there (t=32)."""
    from tests.unit.test_planner import apply, unschedulable

    def step(view: JobView, pods: list[Any], now: float) -> tuple[JobView, list[Any]]:
        decided = decide(view, "uid", pods, [], at(now))
        domains = {
            int(w["metadata"]["labels"][contract.LABEL_POD_INDEX]): w["metadata"]["labels"].get(
                topology.DOMAIN_LABEL, ""
            )
            for w in decided.workers
        }
        made = [
            replace(p, domain=domains[p.index]) if p.index in domains else p
            for p in apply(decided.plan, pods)
        ]
        return with_state(view, decided.plan.status), made

    view, pods = step(view, [], 0)
    observed = [running(pods[0]), running(pods[1])] + [unschedulable(p, 0) for p in pods[2:]]
    view, pods = step(view, observed, 31)
    view, pods = step(view, pods, 32)
    return view, [running(p) for p in pods]


def test_a_grow_backs_capacity_probes_are_placed_in_the_jobs_free_domains() -> None:
    """An elastic job shrunk out of rack2 probes for its grow-back in rack2 (the free slots of
    its admission), not anywhere in the cluster: a probe that fits proves room where the pods
    will go."""
    ta = _assignment({"rack1": 2, "rack2": 2})
    view, pods = _shrunk_out_of_the_last_two(gated(_elastic({"required": RACK}), _gate(ta)))
    assert view.kueue is not None and view.kueue.topology is not None
    rack1 = {topology.domain_key(d.values) for d in view.kueue.topology.domains[:2]}
    assert len(pods) == 2 and {p.domain for p in pods} == rack1, "the shrunk job kept rack1"
    probing = decide(view, "uid", pods, [], at(100))
    assert len(probing.probes) == 2
    for probe in probing.probes:
        assert probe["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_PROBE
        assert probe["spec"]["nodeSelector"][RACK] == "rack2", probe["spec"]
        assert probe["spec"]["nodeSelector"][BLOCK] == "b1"


def test_without_kueue_a_probe_asks_for_the_jobs_domain_and_avoids_doomed_nodes() -> None:
    view, pods = _shrunk_out_of_the_last_two(_elastic({"required": RACK}, avoid_nodes=("n9",)))
    probing = decide(view, "uid", pods, [], at(100))
    assert probing.probes
    for probe in probing.probes:
        affinity = probe["spec"]["affinity"]
        term = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == RACK
        assert term["labelSelector"]["matchLabels"][contract.LABEL_ROLE] == contract.ROLE_WORKER
        node_terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        fields = [f for t in node_terms["nodeSelectorTerms"] for f in t["matchFields"]]
        assert {"key": "metadata.name", "operator": "NotIn", "values": ["n9"]} in fields


def _node(name: str, rack: str, block: str = "b1") -> Any:
    from torchjob_operator.common.nodes import NodeView

    return NodeView(name, labels=((BLOCK, block), (RACK, rack), (HOST, name)))


def test_a_worker_outside_the_jobs_domains_is_found_at_the_requested_level() -> None:
    ta = topology.assignment_of(_assignment({"rack1": 2}))
    assert ta is not None
    nodes = {n.name: n for n in (_node("a", "rack1"), _node("b", "rack3"), _node("c", "rack1"))}
    nodes["bare"] = replace(nodes["a"], name="bare", labels=())
    pods = [replace(pod(i), node=n) for i, n in enumerate(["a", "b", "c", "bare", "unknown"])]
    spills, judged = topology.spilled(ta, RACK, pods, nodes)
    assert judged == 3, "a node without the labels, or unknown to the watch, is not judged"
    assert spills == (topology.Spill("tj-worker-1", "b", "rack3"),)
    # Another host of the job's rack is inside a rack-level request, outside a host-level one.
    assert topology.spilled(ta, RACK, [replace(pod(0), node="c")], nodes) == ((), 1)
    other_host = topology.spilled(ta, HOST, [replace(pod(0), node="c")], nodes)[0]
    assert [s.value for s in other_host] == ["c"]
    # The same rack name in another block is another domain.
    far = {"d": _node("d", "rack1", block="b2")}
    assert len(topology.spilled(ta, RACK, [replace(pod(0), node="d")], far)[0]) == 1


def test_the_placed_condition_says_which_worker_spilled_over_and_clears_when_back() -> None:
    gate = _gate(_assignment({"rack1": 2}))
    nodes = {n.name: n for n in (_node("a", "rack1"), _node("b", "rack3"), _node("c", "rack1"))}
    view = replace(gated(_placed({"preferred": RACK}, replicas=2), gate), nodes=nodes)
    first = decide(view, "uid", [], [], at(0))
    view = with_state(view, first.plan.status)
    spilled = [running(replace(pod(0), node="a")), running(replace(pod(1), node="b"))]
    status = decide(view, "uid", spilled, [], at(1)).plan.status
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert (placed["status"], placed["reason"]) == ("False", "SpilledOver")
    assert "tj-worker-1 on node b (rack3)" in placed["message"] and RACK in placed["message"]
    view = with_state(view, status)
    back = [running(replace(pod(0), node="a")), running(replace(pod(1), node="c"))]
    status = decide(view, "uid", back, [], at(2)).plan.status
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert (placed["status"], placed["reason"]) == ("True", "InDomains")
    # Without the Node watch's views nothing is judged, and no condition is written.
    bare = replace(gated(_placed({"preferred": RACK}, replicas=2), gate), nodes={})
    quiet = decide(with_state(bare, first.plan.status), "uid", spilled, [], at(1)).plan.status
    assert "Placed" not in {c["type"] for c in quiet["conditions"]}
