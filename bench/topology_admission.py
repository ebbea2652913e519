"""Topology-aware admission at 512 nodes, and regrowth inside the job's rack (issue 42's measures).

A private kwok cluster (``--cluster-name``) with 512 fake GPU nodes labelled with a three-level
topology: 8 blocks x 8 racks x 8 hosts (``example.com/block``, ``example.com/rack``,
``kubernetes.io/hostname``), 8 GPUs each, so one rack holds 64 one-GPU workers. The real Kueue
(v0.15.0, ``make testbin``) runs as a local process with Topology-Aware Scheduling: a Topology
of the three levels, a ResourceFlavor naming it, a ClusterQueue with room for all 4096 GPUs and
a LocalQueue ``lq``. The torchjob operator runs from this checkout as a local process.

1. **Admission**: ``--repeats`` times, in ABAB order, a 64-worker TorchJob (one GPU per worker)
   with ``spec.placement.required: example.com/rack`` (all 64 in one rack: the rack is then
   full) and the same job with no ``spec.placement``, both through the same queue. For each:
   the time from the apply to the Workload admitted and to every pod bound (``nodeName`` set),
   polled every ``--interval`` s; its racks and hosts. Deleted, pods and Workload gone, before
   the next.
2. **Regrowth**: a 4-worker job (8 GPUs each: a whole node) with ``required: example.com/rack``;
   ``--losses`` times, a random worker's node is cordoned and its pod deleted (as
   tests/cluster/test_topology.py simulates a lost node), the job regrows (a new generation),
   every worker of it is checked to be bound in the job's rack (regrow: the deletion to all
   bound), the node is uncordoned, and the next loss waits for the job to be Running again.
   The rack has room throughout (4 of its 8 hosts free, one cordoned at a time).

Prints both tables, writes the raw figures to ``--out`` (JSON). Asserts nothing.

    python bench/topology_admission.py [--repeats 3] [--losses 20]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    REPO,
    apply,
    cluster_down,
    cluster_up,
    kubectl,
    logger,
    median,
    spread,
    start_torchjob_operator,
    wait_established,
    wait_for,
)

log = logger("topology")

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
FABRIC = "bench.torchjob.io/fabric"
TOPOLOGY, FLAVOR, CQ, NS = "bench-fabric", "bench-tas", "bench-cq", "default"
BLOCKS = RACKS = HOSTS = 8
GPUS_PER_NODE = 8
KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
JOB_LABEL, GEN_LABEL = "torchjob.io/job-name", "torchjob.io/generation"
INDEX_LABEL = "torchjob.io/pod-index"


def fabric_nodes() -> list[dict[str, Any]]:
    from tests import kube as k

    return [
        k.fake_node_manifest(
            f"fabric-b{b}-r{r}-h{h}",
            gpus=GPUS_PER_NODE,
            labels={FABRIC: "true", BLOCK: f"b{b}", RACK: f"b{b}-r{r}"},
        )
        for b in range(BLOCKS)
        for r in range(RACKS)
        for h in range(HOSTS)
    ]


def kueue_objects() -> list[tuple[str, dict[str, Any]]]:
    """(plural, body) of the Topology, ResourceFlavor, ClusterQueue and LocalQueue."""
    api = "/".join(KUEUE_API)
    quota = {"cpu": "10000", "memory": "100Ti", "nvidia.com/gpu": str(512 * GPUS_PER_NODE)}
    levels = [{"nodeLabel": level} for level in (BLOCK, RACK, HOST)]
    group = {
        "coveredResources": list(quota),
        "flavors": [
            {
                "name": FLAVOR,
                "resources": [{"name": n, "nominalQuota": q} for n, q in quota.items()],
            }
        ],
    }
    return [
        ("topologies", {"apiVersion": api, "kind": "Topology",
                        "metadata": {"name": TOPOLOGY}, "spec": {"levels": levels}}),
        ("resourceflavors", {"apiVersion": api, "kind": "ResourceFlavor",
                             "metadata": {"name": FLAVOR},
                             "spec": {"nodeLabels": {FABRIC: "true"}, "topologyName": TOPOLOGY}}),
        ("clusterqueues", {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": CQ},
                           "spec": {"namespaceSelector": {}, "resourceGroups": [group]}}),
        ("localqueues", {"apiVersion": api, "kind": "LocalQueue",
                         "metadata": {"name": "lq", "namespace": NS},
                         "spec": {"clusterQueue": CQ}}),
    ]  # fmt: skip


def torchjob(
    name: str, replicas: int, gpus: int, placement: dict[str, str] | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "failurePolicy": {"maxRestarts": 100, "backoff": {"initialSeconds": 1, "maxSeconds": 2}},
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "nodeSelector": {FABRIC: "true"},
                "containers": [
                    {
                        "name": "trainer",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "limits": {"nvidia.com/gpu": gpus},
                        },
                    }
                ],
            }
        },
    }
    if placement:
        spec["placement"] = placement
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": spec,
    }


class Fabric:
    """The API clients of the cluster, and what the measures read from it."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.kubeconfig = kubeconfig
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.rack_of = {
            n.metadata.name: n.metadata.labels[RACK]
            for n in self.core.list_node(label_selector=f"{FABRIC}=true").items
        }

    def pods(self, job: str) -> list[Any]:
        items = self.core.list_namespaced_pod(NS, label_selector=f"{JOB_LABEL}={job}").items
        return [p for p in items if p.metadata.deletion_timestamp is None]

    def admitted(self, job: str) -> bool:
        for wl in self.custom.list_namespaced_custom_object(*KUEUE_API, NS, "workloads")["items"]:
            owners = wl["metadata"].get("ownerReferences") or []
            if any(o.get("name") == job for o in owners):
                conditions = (wl.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)
        return False

    def status(self, job: str) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(
            "torchjob.io", "v1alpha1", NS, "torchjobs", job
        )
        return obj.get("status") or {}  # type: ignore[no-any-return]

    def held_domains(self, job: str) -> int | None:
        """Domains in ``status.placement`` (None: the admission had no topologyAssignment)."""
        held = self.status(job).get("placement")
        return None if held is None else len(held.get("domains") or [])

    def delete(self, job: str) -> None:
        self.custom.delete_namespaced_custom_object("torchjob.io", "v1alpha1", NS, "torchjobs", job)

        def gone() -> bool:
            pods = self.core.list_namespaced_pod(NS, label_selector=f"{JOB_LABEL}={job}").items
            wls = self.custom.list_namespaced_custom_object(*KUEUE_API, NS, "workloads")["items"]
            return not pods and not wls

        wait_for(f"the pods and Workload of {job} gone", gone, 300, interval=0.5)


def admit_once(
    fab: Fabric, name: str, placement: dict[str, str] | None, interval: float
) -> dict[str, Any]:
    """Apply a 64-worker job; the seconds to its Workload admitted and to every pod bound."""
    replicas = RACKS * GPUS_PER_NODE  # one GPU each: a rack holds exactly 64
    t0 = time.monotonic()
    apply(fab.kubeconfig, torchjob(name, replicas, 1, placement))
    admitted_s: float | None = None
    deadline = t0 + 600
    while True:
        now = time.monotonic()
        if admitted_s is None and fab.admitted(name):
            admitted_s = now - t0
        pods = fab.pods(name)
        bound = [p for p in pods if p.spec.node_name]
        if len(bound) == replicas:
            bound_s = time.monotonic() - t0
            break
        if now > deadline:
            raise TimeoutError(f"{name}: {len(bound)}/{replicas} pods bound after 600 s")
        time.sleep(interval)
    racks = sorted({fab.rack_of.get(p.spec.node_name, "?") for p in bound})
    held = fab.held_domains(name)
    row = {"job": name, "placement": placement, "pods": replicas, "admitted_s": admitted_s,
           "bound_s": bound_s, "racks": racks, "hosts": len({p.spec.node_name for p in bound}),
           "status_domains": held}  # fmt: skip
    log(
        f"{name}: admitted {admitted_s:.2f} s, all {replicas} bound {bound_s:.2f} s, racks "
        f"{racks}, {row['hosts']} hosts, status.placement domains {held}"
    )
    fab.delete(name)
    return row


def admission(fab: Fabric, repeats: int, interval: float) -> list[dict[str, Any]]:
    """ABAB: the request, then none, ``repeats`` times."""
    rows = []
    for i in range(repeats):
        rows.append(admit_once(fab, f"rack-{i}", {"required": RACK}, interval))
        rows.append(admit_once(fab, f"free-{i}", None, interval))
    return rows


def generation_bound(fab: Fabric, job: str, replicas: int, generation: int) -> Callable[[], Any]:
    def probe() -> list[Any] | None:
        pods = fab.pods(job)
        ok = (
            len(pods) == replicas
            and {p.metadata.labels.get(GEN_LABEL) for p in pods} == {str(generation)}
            and all(p.spec.node_name for p in pods)
        )
        return pods if ok else None

    return probe


def one_loss(
    fab: Fabric, job: str, pods: list[Any], generation: int, rng: random.Random
) -> dict[str, Any]:
    """Cordon a random worker's node and delete its pod; the regrown generation's placement."""
    replicas = len(pods)
    rack = fab.rack_of[pods[0].spec.node_name]
    lost = rng.choice(pods)
    node, index = lost.spec.node_name, lost.metadata.labels[INDEX_LABEL]
    held = {p.spec.node_name for p in pods}
    room = sum(
        1 for n, r in fab.rack_of.items() if r == rack and n not in held
    )  # free hosts of the rack besides the cordoned one (the job's hosts come back to it)
    fab.core.patch_node(node, {"spec": {"unschedulable": True}})
    t0 = time.monotonic()
    fab.core.delete_namespaced_pod(lost.metadata.name, NS, grace_period_seconds=0)
    try:
        again = wait_for(
            f"generation {generation + 1} of {job} bound",
            generation_bound(fab, job, replicas, generation + 1),
            300,
            interval=0.2,
        )
    finally:
        fab.core.patch_node(node, {"spec": {"unschedulable": False}})
    regrow_s = time.monotonic() - t0
    racks = {fab.rack_of.get(p.spec.node_name, "?") for p in again}
    moved = next(p for p in again if p.metadata.labels[INDEX_LABEL] == index)
    return {
        "lost_index": int(index), "lost_node": node, "rack": rack, "free_hosts": room,
        "replacement_node": moved.spec.node_name,
        "replacement_rack": fab.rack_of.get(moved.spec.node_name, "?"),
        "all_in_rack": racks == {rack}, "racks": sorted(racks), "regrow_s": regrow_s,
        "pods": again,
    }  # fmt: skip


def regrowth(fab: Fabric, losses: int, seed: int) -> list[dict[str, Any]]:
    job, replicas = "regrow", 4
    apply(fab.kubeconfig, torchjob(job, replicas, GPUS_PER_NODE, {"required": RACK}))
    pods = wait_for("the regrow job bound", generation_bound(fab, job, replicas, 1), 300, 0.2)
    rng = random.Random(seed)
    rows = []
    for i in range(losses):  # each loss strikes a Running job, as a real one would
        wait_for("regrow Running", lambda: fab.status(job).get("phase") == "Running", 120, 0.2)
        row = one_loss(fab, job, pods, i + 1, rng)
        pods = row.pop("pods")
        rows.append(row)
        log(
            f"loss {i + 1}: worker {row['lost_index']} on {row['lost_node']} -> "
            f"{row['replacement_node']} ({row['replacement_rack']}; job's rack {row['rack']}, "
            f"{row['free_hosts']} free hosts), {row['regrow_s']:.2f} s"
        )
    fab.delete(job)
    return rows


def setup(kubeconfig: Path, work: Path) -> Any:
    """The nodes Ready, Kueue started with its objects, the CRDs; Kueue's Popen."""
    from tests import kube as k
    from tests.cluster.kueue_harness import KueueProcess, create_kueue_object

    fab_nodes = fabric_nodes()
    _ = [apply(kubeconfig, *fab_nodes[i : i + 128]) for i in range(0, len(fab_nodes), 128)]
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(REPO / "crds"))
    wait_established(kubeconfig, "crd/torchjobs.torchjob.io")

    def all_ready() -> bool:
        out = kubectl(kubeconfig, "get", "nodes", "-l", f"{FABRIC}=true", "--no-headers")
        lines = out.splitlines()
        return len(lines) == len(fab_nodes) and all(" Ready " in line for line in lines)

    wait_for(f"the {len(fab_nodes)} fabric nodes Ready", all_ready, 600, interval=2.0)
    cluster = k.Cluster(kubeconfig=kubeconfig)
    proc = KueueProcess(cluster, work)
    proc.start()
    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api_client())
    try:
        for plural, body in kueue_objects():
            create_kueue_object(custom, plural, body, NS if plural == "localqueues" else None)
    except Exception:
        proc.proc.terminate()  # type: ignore[union-attr]
        raise
    return proc.proc  # the process: the cluster goes with everything Kueue installed


def report(rows: list[dict[str, Any]], losses: list[dict[str, Any]]) -> None:
    req = [r for r in rows if r["placement"]]
    free = [r for r in rows if not r["placement"]]
    print(f"\nAdmission of a 64-worker job (1 GPU each) on 512 nodes, {len(req)} repeats, ABAB")
    print(f"{'':34} {'admitted (s)':>22} {'all pods bound (s)':>22}  racks:hosts")
    for label, rs in ((f"required: {RACK}", req), ("no spec.placement", free)):
        adm = spread([r["admitted_s"] or float("nan") for r in rs])
        bnd = spread([r["bound_s"] for r in rs])
        racks = "/".join(f"{len(r['racks'])}:{r['hosts']}" for r in rs)
        print(f"{label:34} {adm:>22} {bnd:>22}  {racks}")
    ratio = median(r["bound_s"] for r in req) / median(r["bound_s"] for r in free)
    print(f"ratio request / no request (median, all bound): {ratio:.2f}")
    if losses:
        inside = sum(row["all_in_rack"] for row in losses)
        room = sum(row["free_hosts"] > 0 for row in losses)
        print(
            f"\nRegrowth: {inside}/{len(losses)} regrown generations with every worker in the "
            f"job's own rack ({room}/{len(losses)} with room in the rack); regrow (loss to all "
            f"bound) {spread([row['regrow_s'] for row in losses])} s"
        )
        for row in losses:
            if not row["all_in_rack"]:
                print(f"  outside: {row}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--losses", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cluster-name", default="bench-topology")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "topology_admission.json")
    args = p.parse_args(argv)
    started = time.monotonic()
    kubeconfig = cluster_up(args.cluster_name)
    work = Path(tempfile.mkdtemp(prefix="topology-"))
    try:
        kueue = setup(kubeconfig, work)
        proc, _ = start_torchjob_operator(kubeconfig, work)
        try:
            fab = Fabric(kubeconfig)
            log(f"set up in {time.monotonic() - started:.0f} s")
            rows = admission(fab, args.repeats, args.interval)
            losses = regrowth(fab, args.losses, args.seed)
        finally:
            proc.stop()
            kueue.terminate()
            kueue.wait(15)
    finally:
        cluster_down(args.cluster_name)
    report(rows, losses)
    total = time.monotonic() - started
    print(f"\nthe whole run: {total:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"admission": rows, "losses": losses, "total_s": total, "args": vars(args)},
                   default=str, indent=1)
    )  # fmt: skip
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
