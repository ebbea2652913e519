"""Fixtures for tests against the local control plane (see tests/kube.py, hack/cluster.sh).

- ``cluster`` (session): starts the kwokctl cluster, or reuses one that is already running
  (e.g. from `make cluster`); tears it down at the end only if this session started it
  (set TORCHJOB_KEEP_CLUSTER=1 to keep it anyway).
- ``kube`` (session): a kubernetes.client.ApiClient for it; ``core_v1`` a CoreV1Api.
- ``namespace``: a fresh namespace per test, deleted afterwards.
- ``real_node`` (session): a real kubelet + containerd node (hack/node.sh) running the images
  of hack/images.sh; only tests that ask for it start it. Missing prerequisites skip those
  tests with what to install, except under CI=true, where they fail.
- ``real_nodes`` (session): at least 3 real nodes (``TORCHJOB_REAL_NODES``, which
  hack/test.sh sets to 3 for the e2e session; more are started beside ``real_node`` if the
  session has fewer), for the multi-node tests and the node faults of hack/node.sh.
- ``node_s3`` (session): the S3-compatible object store of tests/s3.py where the real node's
  pods reach it (``realnode.start_node_s3``); ``S3Server.make_bucket`` gives a test its
  bucket and ``realnode.s3_credentials`` a Secret for the pods' ``envFrom``.

Without the binaries (`make testbin` not run) the tests are skipped, except under CI=true
where that is an error: CI must never go green by skipping the cluster tests.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from tests import kube as helpers
from tests.cluster.operator_harness import (
    CRD_FILE,
    RUNTIME_CRD_FILES,
    TUNE_CRD_FILE,
    Jobs,
    OperatorProcess,
)
from tests.cluster.real_jobs import helm_operator, real_jobs, storage  # noqa: F401 - fixtures
from tests.cluster.realnode import RealNode, RealNodeUnavailable, start_node_s3, tell
from tests.s3 import S3Server, stop_s3_server
from tests.tracking import mlflow_server  # noqa: F401 - a real MLflow server, session-wide


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cluster)


def _unavailable(reason: str) -> None:
    msg = f"local control plane unavailable: {reason}. Run `make testbin` (then `make cluster` to keep one running)."
    if _in_ci():
        pytest.fail(f"CI=true and {msg}", pytrace=False)
    pytest.skip(msg)


def _cluster_up_twice() -> Path:
    """hack/cluster.sh up, and once more from nothing if that fails.

    Every test of a session needs the cluster, so one failed start (a component slow to come
    up on a loaded machine, a cluster left broken by an earlier, killed run) would fail all of
    them; the second try deletes whatever is there first. Both failures are reported.
    """
    try:
        return helpers.cluster_up()
    except Exception as first:
        print(f"hack/cluster.sh up failed; deleting the cluster and trying once more: {first}")
        helpers.cluster_down()
        try:
            return helpers.cluster_up()
        except Exception as second:
            raise RuntimeError(f"{second}\n(the first try: {first})") from second


@pytest.fixture(scope="session")
def cluster() -> Iterator[helpers.Cluster]:
    kind = os.environ.get("TORCHJOB_E2E_KIND_KUBECONFIG")
    if kind:  # hack/e2e-kind.sh: a kind cluster, made and deleted by the script
        yield helpers.Cluster(kubeconfig=Path(kind), started_here=False)
        return
    missing = helpers.missing_binaries()
    if missing:
        why = helpers.go_toolchain_problem()
        shown = ", ".join(str(p) for p in missing[:3])
        _unavailable(
            f"binaries not built ({shown}{' ...' if len(missing) > 3 else ''})"
            + (f"; {why}" if why else "")
        )
    kubeconfig = helpers.default_kubeconfig()
    sessions = helpers.ClusterSessions(kubeconfig)
    sessions.register()  # before `up`, so that a finishing session sees us
    started_here = False
    try:
        started_here = not helpers.cluster_is_healthy(kubeconfig)
        try:
            kubeconfig = _cluster_up_twice()
        except Exception as exc:
            if _in_ci():
                pytest.fail(f"CI=true and the local cluster failed to start: {exc}", pytrace=False)
            raise
        with helpers.ComponentWatchdog(kubeconfig):
            yield helpers.Cluster(kubeconfig=kubeconfig, started_here=started_here)
    finally:
        sessions.unregister()
        keep = os.environ.get("TORCHJOB_KEEP_CLUSTER", "") in ("1", "true")
        # Tear down only what this session started, and never under another live session.
        if started_here and not keep and not sessions.others():
            helpers.cluster_down()


@pytest.fixture(scope="session")
def kube_client(cluster: helpers.Cluster) -> Iterator[Any]:
    client = cluster.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def kube(kube_client: Any) -> Any:
    """kubernetes.client.ApiClient configured for the test cluster."""
    return kube_client


@pytest.fixture(scope="session")
def core_v1(kube_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube_client)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1: Any) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount ready); deleted after the test."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace({"metadata": {"name": name, "labels": {"torchjob.io/test": "true"}}})

    def default_sa() -> bool:
        return any(
            sa.metadata.name == "default"
            for sa in core_v1.list_namespaced_service_account(name).items
        )

    helpers.wait_for(default_sa, 30, f"ServiceAccount {name}/default (kube-controller-manager)")
    try:
        yield name
    finally:
        try:
            core_v1.delete_namespace(name, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:  # a repeated DELETE (the first one's answer was lost) is done
                raise


# --- the operator under test (tests/cluster/operator_harness.py) -------------------------


@pytest.fixture(scope="session")
def crd(cluster: helpers.Cluster) -> None:
    for path in (CRD_FILE, TUNE_CRD_FILE, *RUNTIME_CRD_FILES):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    cluster.wait_established(
        "torchjobs.torchjob.io",
        "torchtunes.torchjob.io",
        "torchruntimes.torchjob.io",
        "clustertorchruntimes.torchjob.io",
    )


# Operators started by the ``operator`` fixture: the Helm-installed operator of the real-node
# tests stops them while it runs (two operators would reconcile the same jobs).
PROCESS_OPERATORS: list[OperatorProcess] = []


@pytest.fixture(scope="session")
def stop_process_operators() -> Callable[[], None]:
    """Stops the operators the ``operator`` fixture started (the ``jobs`` fixture starts one
    again for a later test). A fixture, not the list itself: a test module importing this
    file (``from tests.cluster import conftest``) gets a second copy of it, whose list is
    empty."""

    def stop() -> None:
        for proc in PROCESS_OPERATORS:
            proc.stop()

    return stop


@pytest.fixture(scope="session")
def operator(
    cluster: helpers.Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(cluster, tmp_path_factory.mktemp("operator"))
    PROCESS_OPERATORS.append(proc)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def real_node(cluster: helpers.Cluster, pytestconfig: pytest.Config) -> RealNode:
    kind_node = os.environ.get("TORCHJOB_E2E_KIND_NODE")
    if kind_node:  # hack/e2e-kind.sh loaded the images and labelled the node
        return RealNode(name=kind_node)
    problem = RealNode.prerequisites_problem()
    if problem:
        msg = (
            f"the real node (hack/node.sh) cannot run here: {problem}. On Debian: apt-get "
            "install podman mmdebstrap containerd runc containernetworking-plugins iptables "
            "iproute2; then `make testbin`"
        )
        if _in_ci():
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    try:
        node = RealNode.start()
    except Exception as exc:
        pytest.fail(f"the real node failed to start: {exc}", pytrace=False)
    tell(pytestconfig, node.setup_line())
    return node


@pytest.fixture(scope="session")
def real_nodes(real_node: RealNode, pytestconfig: pytest.Config) -> RealNode:
    if len(real_node.names) >= 3:
        return real_node
    if os.environ.get("TORCHJOB_E2E_KIND_NODE"):
        pytest.skip("hack/e2e-kind.sh's cluster has one real node; these tests need 3")
    try:
        nodes = RealNode.start(count=3)
    except Exception as exc:
        pytest.fail(f"the real nodes failed to start: {exc}", pytrace=False)
    tell(pytestconfig, nodes.setup_line())
    return nodes


@pytest.fixture(scope="session")
def node_s3(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="the s3 extra (s3fs) is not installed")
    try:
        server = start_node_s3(real_node, tmp_path_factory.mktemp("seaweedfs-node"))
    except RealNodeUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        stop_s3_server(server)


@pytest.fixture
def jobs(cluster: helpers.Cluster, kube: Any, namespace: str, operator: OperatorProcess) -> Jobs:
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()  # a previous test killed it
    return Jobs(cluster, kube, namespace, operator)
