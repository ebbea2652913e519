"""Argo CD's health of a TorchJob and of a TorchTune:
argocd/resource_customizations/torchjob.io/{TorchJob,TorchTune}/health.lua run by gopher-lua
(the Lua VM Argo CD embeds) on the cases of their health_test.yaml, Argo CD's own test format;
and kstatus (what Flux computes) on the same objects. The testdata are objects exported from
the test cluster (tests/cluster/test_gitops_health.py writes them with
TORCHJOB_EXPORT_ARGOCD_TESTDATA=1)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.gitops import ARGOCD_DIR, REPO, TUNE_ARGOCD_DIR, argocd_health, kstatus

# Every phase of a study, as its testdata name: (Argo CD health, kstatus).
TUNE_EXPECTED = {
    "running": ("Healthy", "Current"),
    "succeeded": ("Healthy", "Current"),
    "failed": ("Degraded", "Failed"),
    "unobserved": ("Progressing", "InProgress"),
}


@pytest.mark.parametrize("directory", [ARGOCD_DIR, TUNE_ARGOCD_DIR], ids=lambda d: d.name)
def test_health_lua_gives_each_exported_object_its_expected_health(directory: Path) -> None:
    results = argocd_health(directory)
    assert results, "health_test.yaml has cases"
    for r in results:
        assert r["got"] == r["want"], r["inputPath"]


def test_every_argocd_health_status_a_torchjob_can_have_is_covered() -> None:
    tests = yaml.safe_load((ARGOCD_DIR / "health_test.yaml").read_text())["tests"]
    assert {t["healthStatus"]["status"] for t in tests} == {
        "Progressing",
        "Healthy",
        "Degraded",
        "Suspended",
    }
    for t in tests:
        assert (ARGOCD_DIR / t["inputPath"]).is_file(), t["inputPath"]


def test_every_phase_of_a_torchtune_has_a_case() -> None:
    tests = yaml.safe_load((TUNE_ARGOCD_DIR / "health_test.yaml").read_text())["tests"]
    got = {Path(t["inputPath"]).stem: t["healthStatus"]["status"] for t in tests}
    assert got == {n: e[0] for n, e in TUNE_EXPECTED.items()}
    phases = {
        n: (yaml.safe_load((TUNE_ARGOCD_DIR / f"testdata/{n}.yaml").read_text())["status"])["phase"]
        for n in TUNE_EXPECTED
    }
    assert set(phases.values()) == {"Running", "Succeeded", "Failed"}, phases


@pytest.mark.parametrize("name", list(TUNE_EXPECTED))
def test_kstatus_of_a_torchtune_in_every_phase(name: str, tmp_path: Path) -> None:
    obj = yaml.safe_load((TUNE_ARGOCD_DIR / f"testdata/{name}.yaml").read_text())
    got = kstatus([obj], tmp_path)[obj["metadata"]["name"]]["status"]
    assert got == TUNE_EXPECTED[name][1]


@pytest.mark.parametrize("doc", ["fits-your-cluster.md", "platform.md"])
def test_the_documented_argocd_cm_patch_holds_each_script_byte_for_byte(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text()
    block = re.search(r"argocd-cm --type merge --patch-file <\(\n(.*?)\)\n```", text, re.S)
    assert block, f"docs/{doc} has the argocd-cm patch"
    done = subprocess.run(
        ["bash", "-c", block.group(1)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    data = yaml.safe_load(done.stdout)["data"]
    for d in (ARGOCD_DIR, TUNE_ARGOCD_DIR):
        key = f"resource.customizations.health.torchjob.io_{d.name}"
        assert data[key] == (d / "health.lua").read_text(), key
