"""GitOps health of TorchJobs (issue 17) and TorchTunes (issue 28) in every phase, from the
real evaluators.

Real TorchJobs and TorchTunes on the test cluster (the operator running, kwok pods) are brought into each
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
from tests.gitops import ARGOCD_DIR, TUNE_ARGOCD_DIR, argocd_health, kstatus

from torchjob.api.models import GROUP, PLURAL, VERSION, Progress
from torchjob.api.torchtune import PLURAL as TUNE_PLURAL

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
    _argocd_health_of(objects, {n: e[1] for n, e in EXPECTED.items()}, ARGOCD_DIR, tmp_path)


# TorchTune (issue 28): a study in every phase, by testdata name: (kstatus, Argo CD health).
TUNE_EXPECTED = {
    "running": ("Current", "Healthy"),
    "succeeded": ("Current", "Healthy"),
    "failed": ("Failed", "Degraded"),
    # The operator stopped, then spec.parallelism changed: generation ahead of observedGeneration.
    "unobserved": ("InProgress", "Progressing"),
}


def _study(name: str, **trial: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchTune",
        "metadata": {"name": name},
        "spec": {
            "searchSpace": [{"name": "x", "type": "grid", "values": [1.0]}],
            "sampler": {"type": "grid"},
            "objective": {"metric": "loss", "mode": "min"},
            "maxFailedTrials": 0,
            "trialTemplate": {"spec": torchjob("trial", replicas=1, **trial)["spec"]},
        },
    }


def test_kstatus_and_argocd_health_of_torchtunes_in_every_phase(jobs: Jobs, tmp_path: Path) -> None:
    def tune(name: str) -> dict[str, Any]:
        return jobs.custom.get_namespaced_custom_object(  # type: ignore[return-value]
            GROUP, VERSION, jobs.ns, TUNE_PLURAL, f"tune-{name}"
        )

    def phase(name: str, want: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            obj = tune(name)
            status = obj.get("status") or {}
            ok = status.get("phase") == want and status.get("observedGeneration") == obj[
                "metadata"
            ].get("generation")
            return obj if ok else None

        obj: dict[str, Any] = k.wait_for(
            probe, 60, lambda: f"TorchTune tune-{name} {want}: {tune(name)}"
        )
        return obj

    for n in TUNE_EXPECTED:
        trial = {"failurePolicy": {"permanentExitCodes": [3]}} if n == "failed" else {}
        jobs.apply(_study(f"tune-{n}", **trial))
    for n in TUNE_EXPECTED:
        pods = jobs.wait_running_pods(f"tune-{n}-t0", 1, generation=0)
        if n == "succeeded":
            # Rank 0's report, as the runtime's reporter writes it: a trial that succeeds
            # without the objective metric counts as failed.
            progress = Progress(step=1, metrics={"loss": 0.5}).to_wire()
            jobs.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                jobs.ns,
                PLURAL,
                "tune-succeeded-t0",
                {"status": {"progress": progress}},
            )
            k.wait_for(
                lambda: any(
                    t.get("step") == 1 for t in tune("succeeded")["status"].get("trials") or []
                ),
                60,
                "the study recorded the trial's report",
            )
        if n in ("succeeded", "failed"):
            jobs.exit_pod(pods[0].metadata.name, 0 if n == "succeeded" else 3)
    objects = {
        "running": phase("running", "Running"),
        "succeeded": phase("succeeded", "Succeeded"),
        "failed": phase("failed", "Failed"),
    }
    phase("unobserved", "Running")
    jobs.operator.stop()
    try:
        jobs.kubectl(
            "patch", "tt/tune-unobserved", "--type=merge", "-p", '{"spec":{"parallelism":2}}'
        )
        unobserved = tune("unobserved")
        assert unobserved["metadata"]["generation"] > unobserved["status"]["observedGeneration"]
        objects["unobserved"] = unobserved
    finally:
        jobs.operator.start()
    objects = {n: _export(o) for n, o in objects.items()}

    verdicts = {n: v["status"] for n, v in _kstatus_by_case(objects, tmp_path).items()}

    _argocd_health_of(
        objects, {n: e[1] for n, e in TUNE_EXPECTED.items()}, TUNE_ARGOCD_DIR, tmp_path
    )

    assert verdicts == {n: e[0] for n, e in TUNE_EXPECTED.items()}


def _kstatus_by_case(objects: dict[str, dict[str, Any]], tmp: Path) -> dict[str, dict[str, Any]]:
    by_name = kstatus(list(objects.values()), tmp)
    return {n: by_name[o["metadata"]["name"]] for n, o in objects.items()}


def _argocd_health_of(
    objects: dict[str, dict[str, Any]], expected: dict[str, str], argocd_dir: Path, tmp: Path
) -> None:
    """Run ``argocd_dir``'s health.lua on the live ``objects`` (by testdata name) in Argo CD's
    layout and test format, and assert the ``expected`` health of each, with a message. With
    TORCHJOB_EXPORT_ARGOCD_TESTDATA=1 the objects and verdicts become the committed testdata."""
    case_dir = tmp / argocd_dir.name
    (case_dir / "testdata").mkdir(parents=True)
    shutil.copy(argocd_dir / "health.lua", case_dir / "health.lua")
    for n, obj in objects.items():
        (case_dir / "testdata" / f"{n}.yaml").write_text(yaml.safe_dump(obj))
    cases = [
        {"healthStatus": {"status": h, "message": ""}, "inputPath": f"testdata/{n}.yaml"}
        for n, h in expected.items()
    ]
    (case_dir / "health_test.yaml").write_text(yaml.safe_dump({"tests": cases}))
    got = {r["inputPath"]: r["got"] for r in argocd_health(case_dir)}
    assert {p: g["status"] for p, g in got.items()} == {
        f"testdata/{n}.yaml": h for n, h in expected.items()
    }
    for g in got.values():
        assert g["message"], got

    if os.environ.get("TORCHJOB_EXPORT_ARGOCD_TESTDATA") == "1":
        for n, obj in objects.items():
            (argocd_dir / "testdata" / f"{n}.yaml").write_text(yaml.safe_dump(obj))
        for c in cases:
            c["healthStatus"]["message"] = got[c["inputPath"]]["message"]
        (argocd_dir / "health_test.yaml").write_text(
            yaml.safe_dump({"tests": cases}, sort_keys=False)
        )
