"""Argo CD's health of a TorchJob: argocd/resource_customizations/torchjob.io/TorchJob/health.lua
run by gopher-lua (the Lua VM Argo CD embeds) on the cases of its health_test.yaml, Argo CD's
own test format. The testdata are TorchJobs exported from the test cluster
(tests/cluster/test_gitops_health.py writes them with TORCHJOB_EXPORT_ARGOCD_TESTDATA=1)."""

from __future__ import annotations

import yaml
from tests.gitops import ARGOCD_DIR, argocd_health


def test_health_lua_gives_each_exported_torchjob_its_expected_health() -> None:
    results = argocd_health()
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
