#!/usr/bin/env python3
"""Write crds/ (TorchJob, TorchTune and the runtime blueprints) from torchjob.api (run by `make crds`),
and the chart's worker admission policy from torchjob_operator.resources.worker_policy.

The pod template schema comes from the OpenAPI document of Kubernetes KUBE_VERSION in the Go
module cache (torchjob.api.kube_schema); when it is missing, this downloads that one module
with `go mod download` (what `make testbin` does anyway) or says how to get it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

from torchjob.api import kube_schema
from torchjob.api.crd import render_crd_yaml, render_tune_crd_yaml
from torchjob.api.runtime_crd import FILES, render_runtime_crd_yaml
from torchjob_operator.resources.worker_policy import chart_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = ROOT / "crds" / "torchjob.io_torchjobs.yaml"
CHART_COPY = ROOT / "charts" / "torchjob-operator" / "crds" / "torchjob.io_torchjobs.yaml"
TUNE_TARGET = ROOT / "crds" / "torchjob.io_torchtunes.yaml"
TUNE_CHART_COPY = ROOT / "charts" / "torchjob-operator" / "crds" / "torchjob.io_torchtunes.yaml"
WORKER_POLICY = ROOT / "charts" / "torchjob-operator" / "templates" / "worker-policy.yaml"


def _ensure_openapi() -> None:
    try:
        kube_schema.openapi_path()
        return
    except kube_schema.KubeOpenAPIMissing as missing:
        go = shutil.which("go") or "/usr/local/go/bin/go"
        version = kube_schema.kube_version()
        if not pathlib.Path(go).exists():
            raise SystemExit(f"error: {missing}") from None
        print(f"downloading k8s.io/kubernetes@{version} for its OpenAPI document (go mod download)")
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
        done = subprocess.run(
            [go, "mod", "download", f"k8s.io/kubernetes@{version}"], env=env, cwd="/", check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"error: {missing}") from None


def main() -> int:
    _ensure_openapi()
    outputs = {TARGET: render_crd_yaml(), CHART_COPY: render_crd_yaml()}
    outputs[TUNE_TARGET] = outputs[TUNE_CHART_COPY] = render_tune_crd_yaml()
    for file, cluster in FILES.items():
        text = render_runtime_crd_yaml(cluster)
        outputs[TARGET.parent / file] = outputs[CHART_COPY.parent / file] = text
    outputs[WORKER_POLICY] = chart_template()
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
