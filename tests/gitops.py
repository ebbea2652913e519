"""The real GitOps health evaluators, for the tests: hack/gitops-check (built by
`make testbin`) runs Argo CD's Lua VM (gopher-lua) on health.lua and the kstatus library on
objects (TorchJobs, TorchTunes). Nothing here decides a health: it runs the real code and
returns what it said."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kube as k

REPO = Path(__file__).resolve().parents[1]
ARGOCD_DIR = REPO / "argocd" / "resource_customizations" / "torchjob.io" / "TorchJob"
TUNE_ARGOCD_DIR = ARGOCD_DIR.parent / "TorchTune"


def gitops_check() -> Path:
    """The built binary; a failure in CI (make test builds it), a skip elsewhere."""
    v = k.read_versions()
    path = (
        k.testbin_root()
        / f"gitops-check-{v['GOPHER_LUA_VERSION']}-{v['CLI_UTILS_VERSION']}"
        / "gitops-check"
    )
    if not path.is_file():
        msg = f"{path} not built: run `make testbin` (or hack/build-testbin.sh gitops)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    return path


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def argocd_health(directory: Path = ARGOCD_DIR) -> list[dict[str, Any]]:
    """Each case of ``directory``/health_test.yaml: inputPath, want and got (status, message)."""
    done = subprocess.run(
        [str(gitops_check()), "argocd", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return _lines(done.stdout)


def kstatus(objects: list[dict[str, Any]], tmp: Path) -> dict[str, dict[str, Any]]:
    """kstatus' verdict (status, message) on each object, by name."""
    path = tmp / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    done = subprocess.run(
        [str(gitops_check()), "kstatus", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {x["name"]: x for x in _lines(done.stdout)}
