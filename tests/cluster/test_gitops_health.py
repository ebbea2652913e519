"""GitOps health of TorchJobs in every phase, from the real evaluators (issue 17).

Real TorchJobs on the test cluster (the operator running, kwok pods) are brought into each
phase; then kstatus (sigs.k8s.io/cli-utils, what Flux's health checks compute) and Argo CD's
health.lua (run by gopher-lua, Argo CD's Lua VM) are asked about the live objects.
With TORCHJOB_EXPORT_ARGOCD_TESTDATA=1 the objects are also written, as `kubectl get -o yaml`
gives them less managedFields, to the health script's testdata (tests/unit/test_argocd_health.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob, worker_template
from tests.gitops import ARGOCD_DIR, argocd_health, kstatus

pytestmark = pytest.mark.cluster

EXPECTED = {
    # name: (kstatus, Argo CD health)
    "running": ("Current", "Healthy"),
    "succeeded": ("Current", "Healthy"),
    "failed": ("Failed", "Degraded"),
    "suspended": ("Current", "Suspended"),  # as a suspended batch/v1 Job (issue 17)
    "unschedulable": ("InProgress", "Progressing"),
    # `kubectl scale` while the operator is stopped: metadata.generation ahead of
    # status.observedGeneration (the operator is stopped so that the export cannot race it).
    "unobserved": ("InProgress", "Progressing"),
}


def _export(obj: dict[str, Any]) -> dict[str, Any]:
    obj = dict(obj)
    meta = dict(obj["metadata"])
    meta.pop("managedFields", None)
    obj["metadata"] = meta
    return obj


def test_kstatus_and_argocd_health_of_torchjobs_in_every_phase(jobs: Jobs, tmp_path: Path) -> None:
    jobs.apply(torchjob("running", replicas=2))
    jobs.apply(torchjob("succeeded", replicas=1))
    jobs.apply(torchjob("failed", replicas=1, failurePolicy={"permanentExitCodes": [3]}))
    jobs.apply(torchjob("suspended", replicas=2))
    jobs.apply(
        torchjob(
            "unschedulable",
            replicas=1,
            template=worker_template(nodeSelector={"torchjob.io/no-such-node": "x"}),
        )
    )
    for pod in jobs.wait_running_pods("succeeded", 1, generation=0):
        jobs.exit_pod(pod.metadata.name, 0)
    for pod in jobs.wait_running_pods("failed", 1, generation=0):
        jobs.exit_pod(pod.metadata.name, 3)
    jobs.wait_running_pods("suspended", 2, generation=0)
    jobs.kubectl(
        "patch", "tj/suspended", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}'
    )
    jobs.wait_phase("running", "Running")
    jobs.wait_phase("succeeded", "Succeeded")
    jobs.wait_phase("failed", "Failed")
    jobs.wait_phase("suspended", "Suspended")
    jobs.wait(
        "unschedulable",
        lambda s: any(
            c["type"] == "Ready" and c.get("reason") == "Unschedulable"
            for c in s.get("conditions") or []
        ),
        "TorchJob unschedulable Ready=False reason Unschedulable",
        60,
    )

    def observed(name: str) -> dict[str, Any] | None:
        obj = jobs.get(name)
        ok = (
            obj and obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
        )
        return obj if ok else None

    jobs.apply(torchjob("unobserved", replicas=2))
    jobs.wait_phase("unobserved", "Running")
    objects = {
        n: _export(k.wait_for(lambda n=n: observed(n), 30, f"{n} observed"))
        for n in EXPECTED
        if n != "unobserved"
    }
    jobs.operator.stop()
    try:
        jobs.kubectl("scale", "tj/unobserved", "--replicas=3")
        unobserved = jobs.get("unobserved")
        assert unobserved is not None
        assert unobserved["metadata"]["generation"] > unobserved["status"]["observedGeneration"]
        objects["unobserved"] = _export(unobserved)
    finally:
        jobs.operator.start()

    verdicts = kstatus(list(objects.values()), tmp_path)
    assert {n: verdicts[n]["status"] for n in EXPECTED} == {n: e[0] for n, e in EXPECTED.items()}

    # The same objects through health.lua, in Argo CD's layout and test format.
    case_dir = tmp_path / "TorchJob"
    (case_dir / "testdata").mkdir(parents=True)
    shutil.copy(ARGOCD_DIR / "health.lua", case_dir / "health.lua")
    tests = []
    for n, obj in objects.items():
        (case_dir / "testdata" / f"{n}.yaml").write_text(yaml.safe_dump(obj))
        tests.append(
            {
                "healthStatus": {"status": EXPECTED[n][1], "message": ""},
                "inputPath": f"testdata/{n}.yaml",
            }
        )
    (case_dir / "health_test.yaml").write_text(yaml.safe_dump({"tests": tests}))
    got = {r["inputPath"]: r["got"] for r in argocd_health(case_dir)}
    assert {p: g["status"] for p, g in got.items()} == {
        f"testdata/{n}.yaml": e[1] for n, e in EXPECTED.items()
    }
    for g in got.values():
        assert g["message"], got

    if os.environ.get("TORCHJOB_EXPORT_ARGOCD_TESTDATA") == "1":
        for n, obj in objects.items():
            (ARGOCD_DIR / "testdata" / f"{n}.yaml").write_text(yaml.safe_dump(obj))
        (ARGOCD_DIR / "health_test.yaml").write_text(
            yaml.safe_dump(
                {
                    "tests": [
                        {
                            "healthStatus": {
                                "status": EXPECTED[n][1],
                                "message": got[f"testdata/{n}.yaml"]["message"],
                            },
                            "inputPath": f"testdata/{n}.yaml",
                        }
                        for n in EXPECTED
                    ]
                },
                sort_keys=False,
            )
        )
