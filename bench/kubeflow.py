"""Kubeflow's training-operator v1.8.1, built and run as a local process: the system the
operator and goodput benchmarks compare torchjob with.

Built with ``go install`` from the Go module proxy into
``$TORCHJOB_TESTBIN_ROOT/kubeflow-training-operator-v1.8.1`` (about 2.5 minutes cold).
v1.8.1 cannot turn its webhook off: :func:`start_kubeflow` creates its namespace and an
empty ``training-operator-webhook-cert`` Secret, and copies the self-signed certificate that
the operator writes into that Secret to the directory its webhook server waits on. No webhook
configuration is registered, so the webhook never sees a request.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness import (
    Proc,
    free_port,
    http_ok,
    kubectl,
    log,
    testbin_root,
    wait_established,
    wait_for,
)

KF_VERSION = "v1.8.1"
KF_MODULE = "github.com/kubeflow/training-operator"
KF_PACKAGE = f"{KF_MODULE}/cmd/training-operator.v1"
KF_NAMESPACE = "kubeflow"
KF_CERT_SECRET = "training-operator-webhook-cert"
KF_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in v1.8.1 (pkg/cert)
KF_JOB_LABEL = "training.kubeflow.org/job-name"


def build_kubeflow() -> tuple[Path, Path]:
    """(training-operator binary, PyTorchJob CRD), built once with `go install` from the proxy."""
    go = shutil.which("go")
    if go is None:
        sys.exit("error: `go` not found: it builds Kubeflow's training-operator (go.dev/dl)")
    bindir = testbin_root() / f"kubeflow-training-operator-{KF_VERSION}"
    binary = bindir / "training-operator.v1"
    if not binary.exists():
        log(f"building {KF_PACKAGE}@{KF_VERSION} with go install (about 2.5 minutes cold)")
        env = {**os.environ, "GOBIN": str(bindir), "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        subprocess.run([go, "install", f"{KF_PACKAGE}@{KF_VERSION}"], env=env, check=True)
    modcache = subprocess.run(
        [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    crd = (
        Path(modcache)
        / f"{KF_MODULE}@{KF_VERSION}/manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    )
    if not crd.exists():  # the module cache was cleaned after the build: fetch the source again
        subprocess.run([go, "mod", "download", f"{KF_MODULE}@{KF_VERSION}"], check=True)
    return binary, crd


def start_kubeflow(binary: Path, crd: Path, kubeconfig: Path, core: Any, workdir: Path) -> Proc:
    from kubernetes import client

    kubectl(kubeconfig, "apply", "--server-side", "-f", str(crd))
    wait_established(kubeconfig, "crd/pytorchjobs.kubeflow.org")
    with contextlib.suppress(client.ApiException):
        core.create_namespace({"metadata": {"name": KF_NAMESPACE}})
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_secret(KF_CERT_SECRET, KF_NAMESPACE)
    core.create_namespaced_secret(KF_NAMESPACE, {"metadata": {"name": KF_CERT_SECRET}})
    shutil.rmtree(KF_CERT_DIR, ignore_errors=True)
    probe_port = free_port()
    log_path = workdir / "kubeflow-training-operator.log"
    popen = subprocess.Popen(
        [str(binary), f"--kubeconfig={kubeconfig}", "--enable-scheme=pytorchjob",
         f"--metrics-bind-address=127.0.0.1:{free_port()}",
         f"--health-probe-bind-address=127.0.0.1:{probe_port}",
         f"--webhook-server-port={free_port()}"],
        stdout=log_path.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MY_POD_NAMESPACE": KF_NAMESPACE},
    )  # fmt: skip
    proc = Proc("kubeflow", popen, log_path)

    def cert_written() -> dict[str, str] | None:
        secret = core.read_namespaced_secret(KF_CERT_SECRET, KF_NAMESPACE)
        data = secret.data or {}
        return data if "tls.crt" in data and "tls.key" in data else None

    # What a kubelet does for the Secret volume in a real Deployment.
    data = wait_for("Kubeflow's self-signed webhook certificate", cert_written, 60, 0.2)
    KF_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (KF_CERT_DIR / key).write_bytes(base64.b64decode(value))
    wait_for("Kubeflow /readyz", lambda: http_ok(f"http://127.0.0.1:{probe_port}/readyz"), 60, 0.2)
    wait_for(
        "Kubeflow's PyTorchJob controller",
        lambda: (
            "Starting workers" in log_path.read_text(errors="replace")
            and "pytorchjob" in log_path.read_text(errors="replace").lower()
        ),
        60,
        0.2,
    )
    return proc
