"""The SDK (``torchjob.client.TorchJobClient``) and the ``torchjob`` CLI against the real
control plane, with the operator running.

The CLI runs as a subprocess (``python -m torchjob.cli.main``) with ``--kubeconfig`` and no
``KUBECONFIG`` in its environment, as a user would run it. Pod logs come from kwok:
hack/kwok/logs.yaml (a ClusterLogs rule) makes kwok-controller serve every fake container's
log from hack/kwok/logs-worker.txt, proxied by the real kube-apiserver.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import kube as k
from tests.cluster.operator_harness import REPO, Jobs, torchjob

from torchjob import contract
from torchjob.client import (
    KubeconfigError,
    TorchJobAlreadyExists,
    TorchJobClient,
    TorchJobClientError,
    TorchJobNotFound,
    WaitTimeout,
)

pytestmark = pytest.mark.cluster

WORKER_LOG = REPO / "hack" / "kwok" / "logs-worker.txt"
_CRI_LINE = re.compile(r"^(\S+) (stdout|stderr) [FP] (.*)$")


def worker_log_lines() -> list[str]:
    """The text of each line kwok serves for every container (hack/kwok/logs-worker.txt)."""
    lines = []
    for raw in WORKER_LOG.read_text().splitlines():
        m = _CRI_LINE.match(raw)
        assert m, f"{WORKER_LOG}: not a CRI log line: {raw!r}"
        lines.append(m.group(3))
    return lines


def ranked(ranks: range, generations: int = 1) -> list[str]:
    """What `torchjob logs` prints: each rank's lines, prefixed by rank, in timestamp order."""
    text = worker_log_lines()
    return [f"[rank {r}] {t}" for _ in range(generations) for t in text for r in ranks]


def cli_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "runtime"), env.get("PYTHONPATH", "")) if p
    )
    return env


def cli_argv(jobs: Jobs, command: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torchjob.cli.main",
        command,
        "--kubeconfig",
        str(jobs.cluster.kubeconfig),
        "-n",
        jobs.ns,
        *args,
    ]


def cli(
    jobs: Jobs, command: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `torchjob COMMAND --kubeconfig ... -n NS ARGS...`; stdout and stderr captured."""
    return subprocess.run(
        cli_argv(jobs, command, *args),
        capture_output=True,
        text=True,
        timeout=k.scaled(timeout),
        env=cli_env(),
        cwd=REPO,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (
        f"{proc.args} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
    )
    return proc.stdout


@pytest.fixture
def client(jobs: Jobs) -> Iterator[TorchJobClient]:
    c = TorchJobClient(kubeconfig=jobs.cluster.kubeconfig, namespace=jobs.ns)
    try:
        yield c
    finally:
        c.api_client.close()


def write_manifest(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def table_rows(out: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = [line.split() for line in out.strip().splitlines()]
    return header, rows


def wait_status(jobs: Jobs, name: str, **want: Any) -> dict[str, Any]:
    return jobs.wait(  # type: ignore[no-any-return]
        name,
        lambda s: s if all(s.get(key) == value for key, value in want.items()) else None,
        f"TorchJob {name} status {want}",
    )


# --- submit / get / scale / delete ----------------------------------------------------------


def test_cli_submit_get_scale_delete(jobs: Jobs, client: TorchJobClient, tmp_path: Path) -> None:
    manifest = write_manifest(
        tmp_path, torchjob("life", replicas=2, elastic={"minReplicas": 1, "maxReplicas": 4})
    )
    out = ok(cli(jobs, "submit", "-f", str(manifest)))
    assert out.strip() == f"torchjob.torchjob.io/life created in namespace {jobs.ns}"
    created = client.get("life")
    assert created["spec"]["replicas"] == 2
    pods = jobs.wait_running_pods("life", 2, generation=0)
    for p in pods:
        owner = p.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid) == (
            "TorchJob",
            "life",
            created["metadata"]["uid"],
        )

    job = client.wait_for_phase("life", "Running", timeout_s=k.scaled(60))
    assert job["status"]["phase"] == "Running"
    wait_status(jobs, "life", workers="2/2", currentGeneration=0)

    header, rows = table_rows(ok(cli(jobs, "get", "life")))
    assert header == ["NAME", "PHASE", "READY", "GEN", "RESTARTS", "AGE"]
    assert len(rows) == 1 and rows[0][:5] == ["life", "Running", "2/2", "0", "0"]
    assert re.fullmatch(r"\d+[smhd]\S*", rows[0][5]), rows[0]
    header_all, rows_all = table_rows(ok(cli(jobs, "get")))  # every job of the namespace
    assert (header_all, rows_all) == (header, [[*rows[0][:5], rows_all[0][5]]])

    as_json = json.loads(ok(cli(jobs, "get", "life", "-o", "json")))
    assert (as_json["kind"], as_json["metadata"]["name"]) == ("TorchJob", "life")
    assert as_json["metadata"]["uid"] == created["metadata"]["uid"]
    assert as_json["spec"]["replicas"] == 2 and as_json["status"]["phase"] == "Running"
    listed = json.loads(ok(cli(jobs, "get", "-o", "json")))
    assert listed["kind"] == "List" and [i["metadata"]["name"] for i in listed["items"]] == ["life"]
    as_yaml = yaml.safe_load(ok(cli(jobs, "get", "life", "-o", "yaml")))
    assert as_yaml["metadata"]["uid"] == created["metadata"]["uid"]

    out = ok(cli(jobs, "scale", "life", "--replicas", "3"))
    assert out.strip() == "torchjob.torchjob.io/life scaled to 3"
    assert client.get("life")["spec"]["replicas"] == 3
    pods = jobs.wait_running_pods("life", 3, generation=1)
    assert {p.metadata.labels[contract.LABEL_POD_INDEX] for p in pods} == {"0", "1", "2"}
    wait_status(jobs, "life", phase="Running", workers="3/3", currentGeneration=1)
    table = client.table("life")
    assert table.columns == ["NAME", "PHASE", "READY", "GEN", "RESTARTS", "AGE"]
    assert table.rows[0][:5] == ["life", "Running", "3/3", "1", "0"]

    out = ok(cli(jobs, "delete", "life"))
    assert out.strip() == "torchjob.torchjob.io/life deleted"

    def job_gone() -> bool:
        try:
            client.get("life")
        except TorchJobNotFound:
            return True
        return False

    k.wait_for(job_gone, 60, "TorchJob life deleted", core=jobs.core, namespace=jobs.ns)
    # The pods go with it: the real kube-controller-manager's garbage collector follows
    # their ownerReferences (nothing in torchjob deletes them once the job is gone).
    k.wait_for(
        lambda: not jobs.pods("life"),
        60,
        "pods of life garbage-collected",
        core=jobs.core,
        namespace=jobs.ns,
    )
    assert client.list() == []
    proc = cli(jobs, "get")
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.strip() == f"No TorchJobs found in {jobs.ns} namespace."


def test_sdk_create_wait_succeeded(jobs: Jobs, client: TorchJobClient) -> None:
    created = client.create(torchjob("done", replicas=2))
    assert created["metadata"]["namespace"] == jobs.ns
    with pytest.raises(TorchJobAlreadyExists, match=f"TorchJob {jobs.ns}/done"):
        client.create(torchjob("done", replicas=2))
    pods = jobs.wait_running_pods("done", 2, generation=0)
    client.wait_for_phase("done", "Running", timeout_s=k.scaled(60))
    with pytest.raises(WaitTimeout, match="phase='Running'"):
        client.wait_for_phase("done", "Succeeded", timeout_s=1)

    for p in pods:
        k.make_pod_exit(jobs.core, jobs.ns, p.metadata.name, 0)
    job = client.wait_for_phase("done", ["Succeeded", "Failed"], timeout_s=k.scaled(60))
    assert job["status"]["phase"] == "Succeeded" and job["status"]["completionTime"]
    with pytest.raises(TorchJobClientError, match="reached phase Succeeded"):
        client.wait_for_phase("done", "Running", timeout_s=k.scaled(60))
    assert [p.metadata.name for p in client.pods("done")] == ["done-worker-0", "done-worker-1"]
    assert [j["metadata"]["name"] for j in client.list()] == ["done"]


def test_cli_submit_wait_returns_at_the_phase(jobs: Jobs, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, torchjob("waited", replicas=1))
    out = ok(cli(jobs, "submit", "-f", str(manifest), "--wait", "Running", "--timeout", "60"))
    assert out.splitlines() == [
        f"torchjob.torchjob.io/waited created in namespace {jobs.ns}",
        "waited: Running",
    ]
    assert jobs.status("waited")["phase"] == "Running"


# --- logs ---------------------------------------------------------------------------------


def test_logs_prints_every_rank_prefixed(jobs: Jobs, client: TorchJobClient) -> None:
    client.create(torchjob("logged", replicas=2))
    jobs.wait_running_pods("logged", 2, generation=0)

    assert ok(cli(jobs, "logs", "logged")).splitlines() == ranked(range(2))
    assert ok(cli(jobs, "logs", "logged", "-c", "trainer")).splitlines() == ranked(range(2))

    lines = list(client.logs("logged"))
    assert [(line.pod_index, line.pod) for line in lines[:2]] == [
        (0, "logged-worker-0"),
        (1, "logged-worker-1"),
    ]
    assert [line.text for line in lines if line.pod_index == 1] == worker_log_lines()

    bad = cli(jobs, "logs", "logged", "-c", "nope")
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: logs of pod") and "nope" in bad.stderr


def test_logs_follow_streams_restarts_and_ends_with_the_job(jobs: Jobs) -> None:
    jobs.apply(torchjob("followed", replicas=2))
    jobs.wait_running_pods("followed", 2, generation=0)

    proc = subprocess.Popen(
        cli_argv(jobs, "logs", "followed", "--follow"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=REPO,
    )
    out: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        per_pod = len(worker_log_lines())

        def printed(n: int) -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"logs --follow exited {proc.returncode} early: {out}")
            return len(out) >= n

        k.wait_for(lambda: printed(2 * per_pod), 60, lambda: f"both ranks' lines, got {out}")
        # A failure restarts the group: --follow picks up generation 1's pods.
        jobs.exit_pod("followed-worker-1", 1)
        jobs.wait_running_pods("followed", 2, generation=1)
        k.wait_for(lambda: printed(4 * per_pod), 60, lambda: f"generation 1's lines, got {out}")
        assert proc.poll() is None  # the job is still running: so is --follow

        for p in jobs.pods("followed"):
            jobs.exit_pod(p.metadata.name, 0)
        jobs.wait_phase("followed", "Succeeded")
        # kwok never ends a follow stream; the client ends when the job has finished.
        rc = proc.wait(timeout=60)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    assert rc == 0, proc.stderr.read()
    for r in range(2):
        mine = [line for line in out if line.startswith(f"[rank {r}] ")]
        assert mine == [f"[rank {r}] {t}" for t in worker_log_lines()] * 2
    assert len(out) == 4 * per_pod, out


def test_sdk_logs_follow_stop(jobs: Jobs, client: TorchJobClient) -> None:
    client.create(torchjob("stopped", replicas=1))
    jobs.wait_running_pods("stopped", 1, generation=0)
    got: list[str] = []
    want = worker_log_lines()
    deadline = time.monotonic() + 60  # a stalled stream fails the test instead of hanging it

    def stop() -> bool:
        return len(got) >= len(want) or time.monotonic() > deadline

    for line in client.logs("stopped", follow=True, poll_interval_s=0.2, stop=stop):
        got.append(line.text)
    assert got == want


# --- errors -------------------------------------------------------------------------------


def test_missing_job_is_named_with_non_zero_exit(jobs: Jobs, client: TorchJobClient) -> None:
    for command, args in [
        ("get", ["ghost"]),
        ("get", ["ghost", "-o", "json"]),
        ("logs", ["ghost"]),
        ("logs", ["ghost", "--follow"]),
        ("scale", ["ghost", "--replicas", "2"]),
        ("delete", ["ghost"]),
    ]:
        proc = cli(jobs, command, *args)
        assert proc.returncode == 1, (command, args, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr.startswith(f"error: TorchJob {jobs.ns}/ghost"), (command, proc.stderr)
        assert "not found" in proc.stderr, (command, proc.stderr)
    with pytest.raises(TorchJobNotFound, match=f"TorchJob {jobs.ns}/ghost"):
        client.get("ghost")
    with pytest.raises(TorchJobNotFound, match="ghost"):
        list(client.logs("ghost"))


def test_bad_manifest_names_file_and_field(
    jobs: Jobs, client: TorchJobClient, tmp_path: Path
) -> None:
    path = write_manifest(tmp_path, torchjob("bad", replicas=0))
    proc = cli(jobs, "submit", "-f", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: {path}: spec.replicas: Input should be greater than or equal to 1"
    )

    # Rejected locally by torchjob.api's models (before any request): the file and the field.
    doc = torchjob("outside", replicas=5, elastic={"minReplicas": 1, "maxReplicas": 4})
    path = write_manifest(tmp_path, doc)
    proc = cli(jobs, "submit", "-f", str(path))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {path}: spec: "), proc.stderr
    assert "spec.replicas must lie between" in proc.stderr

    # Passes the local checks, rejected by the API server's validation (422): the message
    # still names the file, and the field as the server reports it.
    path = write_manifest(tmp_path, torchjob("Not_A_DNS_Name", replicas=1))
    proc = cli(jobs, "submit", "-f", str(path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {path}: metadata.name: Invalid value: "), proc.stderr
    assert proc.stdout == ""
    assert client.list() == []


def test_credentials_errors(jobs: Jobs, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "torchjob.cli.main", "get", "--kubeconfig", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        cwd=REPO,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: kubeconfig {missing}: no such file"
    with pytest.raises(KubeconfigError, match="no-such-context"):
        TorchJobClient(kubeconfig=jobs.cluster.kubeconfig, context="no-such-context")


def test_kubectl_torchjob_describe_and_history_tell_what_the_job_went_through(jobs: Jobs) -> None:
    """The same CLI as a kubectl plugin (``kubectl-torchjob`` on the PATH): after a pod's
    failure, ``describe`` shows the state, the conditions, the generations and the Events,
    ``history`` the generations (issue 41, items 1 and 5)."""
    jobs.apply(torchjob("storied", replicas=3, membershipPolicy="KeepSurvivors"))
    jobs.wait_running_pods("storied", 3, 0)
    jobs.exit_pod("storied-worker-1", 1)
    jobs.wait_running_pods("storied", 3, generation=1)
    jobs.wait_events("storied", "GenerationStarted")
    env = cli_env()
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    kubeconfig = ["--kubeconfig", str(jobs.cluster.kubeconfig), "-n", jobs.ns]

    def plugin(*args: str) -> str:
        proc = subprocess.run(
            [str(k.kubectl_path()), "torchjob", *args, *kubeconfig],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        return ok(proc)

    history = plugin("history", "storied")
    rows = [line.split() for line in history.splitlines()]
    assert rows[0][:3] == ["GEN", "BEGAN", "CAUSE"], history
    gen1 = next(r for r in rows if r[0] == "1")
    assert "Failure" in gen1, history
    # Worker 1 left (its node named) and a new worker 1 joined under the same name.
    assert any(c.startswith("storied-worker-1@") for c in gen1), history
    assert "storied-worker-1" in gen1, history
    page = k.wait_for(
        lambda: page if "GenerationStarted" in (page := plugin("describe", "storied")) else None,
        30,
        "describe showing the GenerationStarted Event",
    )
    for section in ("Phase:", "Conditions:", "History:", "Events:", "1 restarts charged"):
        assert section in page, page
    assert "generation 1 (Failure)" in page, page
