"""The real Kueue controller manager (``make testbin`` builds it) against the test cluster.

Kueue runs as a process on this machine, like the operator under test, so the API server
reaches its webhooks on 127.0.0.1 (docs/development.md):

* one self-signed serving certificate for 127.0.0.1 (openssl), in the certDir of Kueue's
  config; Kueue's internal cert manager is off (it writes a Secret for an in-cluster Service);
* Kueue's CRDs, taken from the release (config/components/crd/bases), with the conversion
  webhook that its kustomization adds (workloads, clusterqueues, localqueues, cohorts,
  multikueueclusters), pointed
  at ``https://127.0.0.1:<port>/convert``;
* its admission webhooks for its own API (config/components/webhook/manifests.yaml, those
  whose path names kueue-x-k8s-io), each with ``url: https://127.0.0.1:<port><path>``: the
  webhooks of the integrations (batch Jobs, pods, ...) are not registered, so no pod or Job of
  the other tests ever goes through Kueue;
* the configuration: ``manageJobsWithoutQueueName: false``, only the ``batch/job``
  integration, the visibility API server off, every port a free one on 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import exited, free_port, start_on_free_ports

KUEUE = ("kueue.x-k8s.io", "v1beta2")
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
CONVERTED = ("workloads", "clusterqueues", "localqueues", "cohorts", "multikueueclusters")
MUTATING = "torchjob-test-kueue-mutating"
VALIDATING = "torchjob-test-kueue-validating"


def kueue_dir() -> Path:
    return k.testbin_root() / f"kueue-{k.read_versions()['KUEUE_VERSION']}"


def missing() -> str | None:
    d = kueue_dir()
    if not (d / "kueue").is_file() or not (d / "crds").is_dir():
        return f"{d} is incomplete: run `make testbin` (or hack/build-testbin.sh kueue)"
    return None


class KueueProcess:
    def __init__(
        self, cluster: k.Cluster, work: Path, config: Mapping[str, Any] | None = None
    ) -> None:
        self.cluster = cluster
        self.work = work
        self.extra_config = dict(config or {})
        """Top-level fields of Kueue's Configuration added to (or replacing) the ones below
        (e.g. ``multiKueue`` on a manager cluster)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.health_port = free_port()

    @property
    def log_path(self) -> Path:
        return self.work / "kueue.log"

    def logs(self, tail: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])
        except OSError:
            return "(no log)"

    def _certificate(self) -> str:
        certs = self.work / "certs"
        certs.mkdir(exist_ok=True)
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                str(certs / "tls.key"),
                "-out",
                str(certs / "tls.crt"),
                "-subj",
                "/CN=kueue-webhook-127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
                "-addext",
                "extendedKeyUsage=serverAuth",
            ],
            check=True,
            capture_output=True,
        )
        # With its cert manager off, Kueue serves metrics with a certificate it reads from this
        # fixed path (cmd/kueue/main.go) and exits without one: any certificate does.
        if not (METRICS_CERTS / "tls.crt").is_file():
            METRICS_CERTS.mkdir(parents=True, exist_ok=True)
            for name in ("tls.key", "tls.crt"):
                tmp = METRICS_CERTS / f".{name}.{os.getpid()}"
                tmp.write_bytes((certs / name).read_bytes())
                tmp.replace(METRICS_CERTS / name)
        return base64.b64encode((certs / "tls.crt").read_bytes()).decode()

    def _install(self, ca: str) -> None:
        base = f"https://127.0.0.1:{self.port}"
        docs: list[dict[str, Any]] = []
        for path in sorted((kueue_dir() / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            if crd["spec"]["names"]["plural"] in CONVERTED:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"{base}/convert", "caBundle": ca},
                        "conversionReviewVersions": ["v1"],
                    },
                }
            docs.append(crd)
        for doc in yaml.safe_load_all((kueue_dir() / "webhooks.yaml").read_text()):
            if not doc:
                continue
            hooks = [
                h
                for h in doc["webhooks"]
                if "kueue-x-k8s-io" in h["clientConfig"]["service"]["path"]
            ]
            for h in hooks:
                h["clientConfig"] = {
                    "url": base + h["clientConfig"]["service"]["path"],
                    "caBundle": ca,
                }
            mutating = doc["kind"] == "MutatingWebhookConfiguration"
            doc["metadata"] = {"name": MUTATING if mutating else VALIDATING}
            doc["webhooks"] = hooks
            docs.append(doc)
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
        self.cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-",
            input=yaml.safe_dump_all(docs),
        )  # fmt: skip
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        self.cluster.wait_established(*(d["metadata"]["name"] for d in crds))
        self._wait_discovered(crds)

    def _wait_discovered(self, crds: Sequence[Mapping[str, Any]]) -> None:
        """Until the API server's discovery lists every served version of ``crds``: it does
        a moment after they are Established, and Kueue's REST mapper reads it once at start
        (seen in CI: Kueue exited with 1, 'no matches for kind "Workload" in version
        "kueue.x-k8s.io/v1beta2"', right after the Established wait)."""
        wanted: dict[str, set[str]] = {}
        for crd in crds:
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served", True):
                    path = f"/apis/{spec['group']}/{version['name']}"
                    wanted.setdefault(path, set()).add(spec["names"]["plural"])

        def listed() -> bool:
            for path, plurals in wanted.items():
                got = self.cluster.kubectl("get", "--raw", path, check=False)
                if got.returncode != 0:
                    return False
                names = {r["name"] for r in json.loads(got.stdout).get("resources", [])}
                if not plurals <= names:
                    return False
            return True

        k.wait_for(listed, 60, "Kueue's kinds in the API server's discovery", interval=0.5)

    def _config(self) -> Path:
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "manageJobsWithoutQueueName": False,
            "internalCertManagement": {"enable": False},
            "webhook": {
                "port": self.port,
                "host": "127.0.0.1",
                "certDir": str(self.work / "certs"),
            },
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
            "leaderElection": {"leaderElect": False},
            "integrations": {"frameworks": ["batch/job"]},
            "featureGates": {"VisibilityOnDemand": False},
            **self.extra_config,
        }
        path = self.work / "kueue-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> None:
        """Install Kueue's webhooks and CRDs and start it; return once it is ready. A port that
        ``free_port`` found free can be taken by another process (the CI's sessions run side
        by side) before Kueue binds it (CI, 2026-12-06: "listen tcp 127.0.0.1:42727: bind:
        address already in use", the manager's exit): then it starts again on new ports, the
        webhooks installed again for them, up to 3 times."""
        start_on_free_ports(self._start, self._new_ports)

    def _new_ports(self) -> None:
        self.port, self.health_port = free_port(), free_port()

    def _start(self) -> None:
        self._install(self._certificate())
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        self.proc = subprocess.Popen(
            [str(kueue_dir() / "kueue"), f"--config={self._config()}", "--zap-log-level=2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise exited("Kueue", self.proc.returncode, self.logs())
            try:
                url = f"http://127.0.0.1:{self.health_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        k.wait_for(ready, 120, lambda: f"Kueue ready\n{self.logs()}", interval=0.5)

    def stop(self) -> None:
        """Uninstall Kueue from the cluster and end the process: its CRDs go while it still
        runs (it removes its own finalizers), so the tests after this module (and a session
        that reuses the cluster) see a cluster without Kueue, where a queue label is inert."""
        try:
            self._uninstall()
        finally:  # never leave a Kueue process behind, even when its uninstall timed out
            self.end()

    def _uninstall(self) -> None:
        crds = [
            f"crd/{yaml.safe_load(path.read_text())['metadata']['name']}"
            for path in sorted((kueue_dir() / "crds").glob("*.yaml"))
        ]
        self.cluster.kubectl(
            "delete", "--ignore-not-found", "--wait=true", f"--timeout={k.scaled(60):.0f}s", *crds,
            check=False, timeout=90,
        )  # fmt: skip
        self.cluster.kubectl(
            "delete", "--ignore-not-found", "--wait=false",
            f"mutatingwebhookconfiguration/{MUTATING}",
            f"validatingwebhookconfiguration/{VALIDATING}",
            check=False,
        )  # fmt: skip
        for plural in CONVERTED:  # a conversion webhook that is gone would block namespace deletion
            self.cluster.kubectl(
                "patch", f"crd/{plural}.kueue.x-k8s.io", "--type=merge",
                "-p", '{"spec":{"conversion":{"strategy":"None","webhook":null}}}',
                check=False,
            )  # fmt: skip

    def end(self) -> None:
        """End the process only (a cluster about to be deleted needs no uninstall)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def running_kueue(
    cluster: k.Cluster, work: Path, config: Mapping[str, Any] | None = None
) -> Iterator[KueueProcess]:
    """Kueue for one test module, uninstalled after it. Never skipped: if Kueue is not built
    or cannot start, the test fails saying why. ``config``: ``KueueProcess``'s."""
    problem = missing()
    if problem:
        pytest.fail(f"Kueue cannot run: {problem}", pytrace=False)
    proc = KueueProcess(cluster, work, config)
    try:
        proc.start()
    except Exception as e:
        proc.stop()
        pytest.fail(f"Kueue did not start: {e}", pytrace=False)
    try:
        yield proc
    finally:
        proc.stop()


def create_kueue_object(
    custom: Any, plural: str, body: dict[str, Any], namespace: str | None = None
) -> None:
    """Create, retrying while Kueue's webhook is not serving yet (a moment after /readyz)."""

    def attempt() -> bool:
        try:
            if namespace is None:
                custom.create_cluster_custom_object(*KUEUE, plural, body)
            else:
                custom.create_namespaced_custom_object(*KUEUE, namespace, plural, body)
            return True
        except client.ApiException as e:
            if e.status == 409:
                return True
            if e.status == 500 and "webhook" in str(e.body):
                return False
            raise

    k.wait_for(attempt, 30, f"create {plural} {body['metadata']['name']}", interval=0.5)


def remove_queue(
    custom: Any, namespace: str, cq: str, flavor: str, more: Sequence[tuple[str, str]] = ()
) -> None:
    """Take the queue down while Kueue still runs: it removes its ``resource-in-use``
    finalizers only once nothing uses a ClusterQueue or flavor, and only while it runs (a
    reused cluster would otherwise keep them, undeletable, and a CRD deletion would hang).
    ``more``: other cluster objects of Kueue to delete after them, as (plural, name)."""
    custom.delete_collection_namespaced_custom_object(
        "torchjob.io", "v1alpha1", namespace, "torchjobs"
    )

    def workloads_gone() -> bool:
        items = custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
        return not items

    k.wait_for(workloads_gone, 60, f"the Workloads of {namespace} to go", interval=0.5)
    with contextlib.suppress(client.ApiException):
        custom.delete_namespaced_custom_object(*KUEUE, namespace, "localqueues", "lq")
    for plural, name in (("clusterqueues", cq), ("resourceflavors", flavor), *more):
        try:
            custom.delete_cluster_custom_object(*KUEUE, plural, name)
        except client.ApiException as e:
            if e.status != 404:
                raise

        def gone(plural: str = plural, name: str = name) -> bool:
            try:
                custom.get_cluster_custom_object(*KUEUE, plural, name)
            except client.ApiException as e:
                if e.status == 404:
                    return True
                raise
            return False

        k.wait_for(gone, 60, f"{plural} {name} to go (Kueue drops its finalizer)", interval=0.5)
