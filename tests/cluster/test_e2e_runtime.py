"""Operator and runtime end to end: the operator's pods run the real torchjob runtime.

A process kubelet (tests/e2e/kubelet.py) plays the kubelet of one node, so the
worker pods the operator creates become local processes with the env contract.
Generation 0 crashes a rank mid-training; the operator restarts the group
(a failure, charged to maxRestarts); generation 1 resumes from the checkpoint
rank 0 committed and the job succeeds.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from mlflow.tracking import MlflowClient
from tests import kube as k
from tests.cluster.operator_harness import (
    REPO,
    Jobs,
    shrinking_pair,
    torchjob,
    worker_template,
)
from tests.e2e.kubelet import NODE_LABEL, TAINT, ProcessKubelet

from torchjob import contract
from torchjob.checkpoint import CheckpointStorage
from torchjob.rules.drain import drain_seconds

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]


@pytest.fixture
def kubelet(kube: object, tmp_path: Path) -> Iterator[ProcessKubelet]:
    node = ProcessKubelet(api=kube, node="proc-node-0", workdir=tmp_path / "pods", cwd=REPO)
    node.start()
    yield node
    node.stop()


def _e2e_template(*args: str, grace: int = 10, hold_until: int | None = None) -> dict:
    """``hold_until``: the last epoch waits until the job runs that generation."""
    template = worker_template(
        nodeSelector={NODE_LABEL: "true"},
        tolerations=[{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
        terminationGracePeriodSeconds=grace,
    )
    container = template["spec"]["containers"][0]
    container["command"] = [sys.executable, "tests/e2e/train_job.py"]
    container["args"] = list(args)
    if hold_until is not None:
        container.setdefault("env", []).append(
            {"name": "TORCHJOB_E2E_HOLD_UNTIL_GENERATION", "value": str(hold_until)}
        )
    return template


def _first_steps(*logs: str) -> dict[tuple[int, int], tuple[int, str]]:
    """(generation, rank) -> (pid, parameters after its first step), from train_job.py's logs:
    which process trained each generation, and what every rank held after that step."""
    return {
        (int(g), int(r)): (int(pid), params)
        for log in logs
        for g, r, pid, params in re.findall(
            r"^generation (\d+) rank (\d+) pid (\d+) params (.*)$", log, re.M
        )
    }


def _wait_epoch_3(jobs: Jobs, name: str) -> None:
    """Until rank 0 reported epoch 3 (a checkpoint exists)."""
    jobs.wait(
        name,
        lambda s: s if (s.get("progress") or {}).get("epoch", -1) >= 3 else None,
        "rank 0 to report epoch 3",
        timeout=400,
    )


# The grace period of a draining job's pods: 30 s (a pod given notice trains on for 20 s) times
# CI's time scale, so that on a loaded machine the replacement can start and import torch
# within the drain, which is the path under test.
DRAIN_GRACE = int(k.scaled(30))


def _draining_job(name: str, epochs: int, storage: Path, **template: int) -> dict:
    """Two KeepSurvivors pods that may shrink to one, grace ``DRAIN_GRACE`` (30 s at time
    scale 1): a pod given notice trains on for ``drain_seconds(DRAIN_GRACE)`` (20 s)
    (``replaceBeforeLeaving``, the default); no restart allowed."""
    return shrinking_pair(
        name,
        template=_e2e_template(str(epochs), "-1", "0.2", grace=DRAIN_GRACE, **template),
        checkpoint={"path": str(storage)},
    )


def _evict_after_epoch_3(jobs: Jobs, name: str, pod: str, *, hold: bool = False) -> None:
    """Once rank 0 reported epoch 3 (a checkpoint exists), the Eviction API takes ``pod``;
    ``hold``: a finalizer keeps its name taken until ``k.release_held``."""
    _wait_epoch_3(jobs, name)
    if hold:
        k.evict_held(jobs.core, jobs.ns, pod)
        return
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod))
    jobs.core.create_namespaced_pod_eviction(pod, jobs.ns, eviction)


def _wait_finished(jobs: Jobs, kubelet: ProcessKubelet, name: str) -> dict:
    def finished() -> dict | None:
        status = jobs.status(name)
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    return k.wait_for(  # type: ignore[no-any-return]
        finished,
        900,  # a wait, not a bound: at CI's load a two-generation job took over 300 s
        lambda: f"{name} job to finish\n{jobs.describe(name)}\n{kubelet.log_of(name)}",
        interval=0.5,
    )


def test_worker_crash_restarts_group_and_resumes_from_checkpoint(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path, mlflow_server: str
) -> None:
    storage = tmp_path / "checkpoints"
    template = _e2e_template("6", "3")
    # Experiment tracking as a user turns it on in a pod: the tracking server's URI alone.
    template["spec"]["containers"][0].setdefault("env", []).append(
        {"name": "MLFLOW_TRACKING_URI", "value": mlflow_server}
    )
    manifest = torchjob(
        "e2e",
        replicas=2,
        backend="gloo",
        template=template,
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 1}},
    )
    jobs.apply(manifest)

    status = _wait_finished(jobs, kubelet, "e2e")
    logs = kubelet.log_of("e2e-worker-0")
    assert status["phase"] == "Succeeded", f"{jobs.describe('e2e')}\n{kubelet.log_of('e2e')}"
    assert status["restarts"] == 1 and status["disruptions"] == 0
    assert status["currentGeneration"] == 1
    # Both pods fail within the same second: rank 1 dies, and rank 0's collective breaks.
    # Pod 0's runtime says in its termination message that it only lost a peer, so the
    # operator blames pod 1 and quotes pod 1's own summary.
    assert status["lastFailure"]["pod"] == "e2e-worker-1", jobs.describe("e2e")
    assert status["lastFailure"]["exitCode"] != 0
    assert status["lastFailure"]["message"] == "rank 1 worker process died: exit code 1"
    failed = [e for e in jobs.wait_events("e2e", "WorkerFailed") if e.reason == "WorkerFailed"]
    assert "e2e-worker-1 exited with code 1 (Error): rank 1 worker process died" in (
        failed[0].message
    )
    assert "rank 1 crashing at epoch 3" in kubelet.log_of("e2e-worker-1")
    # Generation 1 picked up where generation 0 left off (epoch 2 or 3 committed), not at 0.
    assert (
        "resumed from epoch 2 at generation 1" in logs
        or "resumed from epoch 3 at generation 1" in logs
    ), logs
    assert "done: 6 epochs, world size 2" in logs
    committed = CheckpointStorage(str(storage)).list_committed()
    assert committed, f"no committed checkpoint under {storage}"

    # Rank 0 reported its progress into the TorchJob's status with the per-job ServiceAccount.
    progress = status.get("progress") or {}
    # The pods' own words about their writes first: a CI page shows only the start of this.
    said = [
        line
        for pod in ("e2e-worker-0", "e2e-worker-1")
        for line in kubelet.log_of(pod).splitlines()
        if "torchjob:" in line or "generation" in line
    ]
    assert progress.get("epoch") == 5, "\n".join([*said, str(status)])
    assert progress.get("lastCheckpoint") == committed[-1].path
    assert "loss" in progress.get("metrics", {})
    header, row = jobs.kubectl("get", "tj", "e2e", "-o", "wide").stdout.strip().splitlines()
    assert row.split()[header.split().index("EPOCH")] == "5"

    # Rank 0's pod logged every report and checkpoint URI to the real MLflow server, both
    # generations into one run, and the run's id is in the job's status.
    tracking = status.get("tracking") or {}
    assert tracking.get("backend") == "mlflow" and tracking.get("runId"), status
    mlflow = MlflowClient(mlflow_server)
    (experiment,) = [e for e in mlflow.search_experiments() if e.name == "e2e"]
    (run,) = mlflow.search_runs([experiment.experiment_id])
    assert run.info.run_id == tracking["runId"]
    assert run.data.tags["torchjob.checkpoint"] == committed[-1].path
    losses = mlflow.get_metric_history(run.info.run_id, "loss")
    assert progress["metrics"]["loss"] in {m.value for m in losses}, losses  # the last report
    account = f"--as=system:serviceaccount:{jobs.ns}:e2e-worker"
    own = ("auth", "can-i", "patch", "torchjobs.torchjob.io/e2e", "--subresource=status", account)
    other = (
        "auth",
        "can-i",
        "patch",
        "torchjobs.torchjob.io/other",
        "--subresource=status",
        account,
    )
    assert jobs.kubectl(*own, check=False).stdout.strip() == "yes"
    assert jobs.kubectl(*other, check=False).stdout.strip() == "no", "limited to its own job"
    assert (
        jobs.kubectl("auth", "can-i", "list", "pods", account, check=False).stdout.strip() == "no"
    )


def test_preempted_pod_stops_every_rank_at_one_checkpoint_and_the_job_resumes(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """SIGTERM reaches only the evicted pod's ranks; rank 0 lives in the other pod. The
    stop flag is all-reduced at each report, so both pods leave at the same report, after
    rank 0 committed its checkpoint, and the next generation resumes from exactly there."""
    storage = tmp_path / "checkpoints"
    epochs = 60
    manifest = torchjob(
        "spot",
        replicas=2,
        backend="gloo",
        template=_e2e_template(str(epochs), "-1", "0.2", grace=30),
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 0},
    )
    jobs.apply(manifest)
    jobs.wait(
        "spot",
        lambda s: s if (s.get("progress") or {}).get("epoch", -1) >= 3 else None,
        "rank 0 to report epoch 3",
        timeout=400,
    )
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name="spot-worker-1", namespace=jobs.ns)
    )
    jobs.core.create_namespaced_pod_eviction("spot-worker-1", jobs.ns, eviction)

    status = _wait_finished(jobs, kubelet, "spot")
    logs = {i: kubelet.log_of(f"spot-worker-{i}") for i in (0, 1)}
    assert status["phase"] == "Succeeded", f"{jobs.describe('spot')}\n{logs}"
    # An eviction is a disruption: it never touches maxRestarts (0 here).
    assert (status["restarts"], status["disruptions"]) == (0, 1), status
    assert status["currentGeneration"] == 1

    # Each generation-0 pod's runtime said why it stopped (its termination message, written
    # before fit() raised): both at the same report, neither a crash.
    said = {
        i: "".join(kubelet.termination_messages(f"spot-worker-{i}")) for i in (0, 1)
    }  # generation 1 succeeded and said nothing
    stops = {
        i: re.findall(r"^torchjob: training stopped on request at report (\d+)", said[i])
        for i in said
    }
    assert len(stops[0]) == 1 and stops[0] == stops[1], f"one common stop report: {said}\n{logs}"
    # Each stopped pod exited 75 (stopped as asked) with one line and no traceback (defect 3).
    for log in logs.values():
        assert "(exit code 75: stopped as asked)" in log and "Traceback" not in log, log
    stopped_at = int(stops[0][0])
    # Report n carries epoch n - 1's checkpoint: generation 1 resumes there, losing nothing.
    assert f"resumed from epoch {stopped_at - 1} at generation 1" in logs[0], logs[0]
    assert f"done: {epochs} epochs, world size 2" in logs[0]


def test_keep_survivors_the_surviving_pod_rejoins_the_next_generation(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """Rank 1 dies; pod 0's runtime sees only a peer failure, stays up, follows the job's
    status to generation 1 and forms the new group with the replacement pod 1."""
    storage = tmp_path / "checkpoints"
    manifest = torchjob(
        "keep",
        replicas=2,
        backend="gloo",
        membershipPolicy="KeepSurvivors",
        template=_e2e_template("8", "3", "0.1"),
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 2, "backoff": {"initialSeconds": 1}},
    )
    jobs.apply(manifest)
    survivor = jobs.wait_running_pods("keep", 2, generation=0, timeout=300)[0]
    status = _wait_finished(jobs, kubelet, "keep")
    logs = {i: kubelet.log_of(f"keep-worker-{i}") for i in (0, 1)}
    assert status["phase"] == "Succeeded", f"{jobs.describe('keep')}\n{logs}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (1, 0, 1)
    assert status["lastFailure"]["pod"] == "keep-worker-1"

    pod0 = jobs.core.read_namespaced_pod("keep-worker-0", jobs.ns)
    assert pod0.metadata.uid == survivor.metadata.uid, "pod 0 was kept, not recreated"
    assert pod0.metadata.labels[contract.LABEL_GENERATION] == "1"
    assert "this pod stays and waits for generation 1" in logs[0], logs[0]
    assert re.search(r"resumed from epoch [23] at generation 1", logs[0]), logs[0]
    assert "done: 8 epochs, world size 2" in logs[0]
    assert len(kubelet.termination_messages("keep-worker-0")) == 1, "one container, one run"


def test_keep_survivors_a_preemption_costs_only_the_preempted_pod(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """Pod 1 is evicted: every rank stops at one report (rank 0 commits), pod 0 stays up and
    follows the job to generation 1, where a new pod 1 joins it from that checkpoint."""
    storage = tmp_path / "checkpoints"
    epochs = 40
    manifest = torchjob(
        "kept",
        replicas=2,
        backend="gloo",
        membershipPolicy="KeepSurvivors",
        template=_e2e_template(str(epochs), "-1", "0.2", grace=30),
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 0},
    )
    jobs.apply(manifest)
    survivor = jobs.wait_running_pods("kept", 2, generation=0, timeout=300)[0]
    _evict_after_epoch_3(jobs, "kept", "kept-worker-1")

    status = _wait_finished(jobs, kubelet, "kept")
    logs = {i: kubelet.log_of(f"kept-worker-{i}") for i in (0, 1)}
    assert status["phase"] == "Succeeded", f"{jobs.describe('kept')}\n{logs}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (0, 1, 1)
    pod0 = jobs.core.read_namespaced_pod("kept-worker-0", jobs.ns)
    assert pod0.metadata.uid == survivor.metadata.uid, "the survivor kept its pod (and GPUs)"

    said = "".join(kubelet.termination_messages("kept-worker-1"))
    stops = re.findall(r"^torchjob: training stopped on request at report (\d+)", said)
    assert len(stops) == 1, f"{said}\n{logs}"
    assert "the group stopped for a membership change" in logs[0], logs[0]
    assert f"resumed from epoch {int(stops[0]) - 1} at generation 1" in logs[0], logs[0]
    assert f"done: {epochs} epochs, world size 2" in logs[0]
    # Re-formed in place: pod 0's worker process trained both generations, and the new pod 1
    # holds the same parameters as the survivor after the first step of generation 1.
    firsts = _first_steps(logs[0], logs[1])
    assert firsts[(0, 0)][0] == firsts[(1, 0)][0], f"rank 0 changed process\n{logs[0]}"
    assert firsts[(1, 1)][1] == firsts[(1, 0)][1], f"newcomer differs\n{logs}"


def test_losing_pod_0_the_survivor_goes_on_as_rank_0_in_its_own_process(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """An elastic KeepSurvivors job (shrinkOnDisruption) loses pod 0, the rank 0 that hosts
    the rendezvous: pod 1 goes on at once as rank 0 of a group of one (status.members [1]),
    in the same worker process, from the checkpoint of the stop; the replacement, created at
    once as pod 2 (pod 0 holds its name while it terminates), joins behind it (members
    [1, 2]) and receives the same parameters. Nothing is charged."""
    storage = tmp_path / "checkpoints"
    epochs = 40
    manifest = torchjob(
        "lead",
        replicas=2,
        backend="gloo",
        membershipPolicy="KeepSurvivors",
        elastic={
            "minReplicas": 1,
            "maxReplicas": 2,
            "shrinkOnDisruption": True,
            "replaceBeforeLeaving": False,  # the shrink path (the drain's test is below)
        },
        template=_e2e_template(str(epochs), "-1", "0.2", grace=30, hold_until=2),
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 0},
    )
    # Generation 0 holds at epoch 5 until the loss: on a starved CI machine the eviction came
    # at epoch 38 of 40, and generation 1's first epoch was the last one, which holds.
    manifest["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "TORCHJOB_E2E_HOLD_AT", "value": "5:1"}
    )
    jobs.apply(manifest)
    pods = jobs.wait_running_pods("lead", 2, generation=0, timeout=300)
    survivor = next(p for p in pods if p.metadata.name == "lead-worker-1")
    # Held: pod 0 keeps its name while it terminates, so the replacement is pod 2 whether
    # or not the evicted pod's processes end before the next pass (they did on a busy
    # machine, and the replacement took index 0). The replacement's start is held too (a
    # node pulling its image) until pod 1 trained generation 1 alone: on a fast machine it
    # was Ready before pod 1 formed generation 1, and pod 1 went straight to generation 2.
    kubelet.hold_starts("lead-worker-")
    try:
        _evict_after_epoch_3(jobs, "lead", "lead-worker-0", hold=True)
        k.wait_for(
            lambda: re.search(r"^generation 1 rank 0 pid", kubelet.log_of("lead-worker-1"), re.M),
            300,
            lambda: f"pod 1 to train generation 1 alone\n{jobs.describe('lead')}",
            interval=0.5,
        )
        kubelet.release_starts("lead-worker-")
        status = _wait_finished(jobs, kubelet, "lead")
    finally:
        kubelet.release_starts("lead-worker-")
        k.release_held(jobs.core, jobs.ns, "lead-worker-0")
    logs = {i: kubelet.log_of(f"lead-worker-{i}") for i in (0, 1, 2)}
    assert status["phase"] == "Succeeded", f"{jobs.describe('lead')}\n{logs}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (0, 1, 2)
    assert status["members"] == [1, 2], status
    pod1 = jobs.core.read_namespaced_pod("lead-worker-1", jobs.ns)
    assert pod1.metadata.uid == survivor.metadata.uid, "the survivor kept its pod"
    firsts = _first_steps(logs[1], logs[2])
    # Pod 1's worker was rank 1, then rank 0 alone, then rank 0 of two: one process.
    pids = [firsts.get(key, (None,))[0] for key in ((0, 1), (1, 0), (2, 0))]
    assert None not in pids and len(set(pids)) == 1, f"{firsts}\n{logs[1]}"
    assert firsts[(2, 1)][1] == firsts[(2, 0)][1], f"the newcomer differs\n{logs}"
    assert f"done: {epochs} epochs, world size 2" in logs[1], logs[1]
    assert "rank 0 of 1 on" in logs[1], f"pod 1 led generation 1 alone\n{logs[1]}"
    said = "".join(kubelet.termination_messages("lead-worker-0"))
    stops = re.findall(
        r"^torchjob: training stopped on request at report \d+; "
        r"latest checkpoint: .*checkpoint_(\d+)$",
        said,
        re.M,
    )
    assert len(stops) == 1, f"{said}\n{logs}"
    # Generation 1 resumed from the latest checkpoint the evicted rank 0 had committed
    # (checkpoint k holds epoch k - 1; the reports while held at epoch 5 carry none).
    assert f"resumed from epoch {int(stops[0]) - 1} at generation 1" in logs[1], logs[1]


def test_an_evicted_pod_trains_on_until_its_replacement_takes_its_place(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """elastic.replaceBeforeLeaving (the default), grace 30 s: pod 1 is evicted and its
    workers train on (SIGTERM starts a 20 s drain) while the replacement, pod 2 (pod 1 holds
    its name), starts and imports torch. Once it is Ready, generation 1 is pods [0, 2] at the
    full size: the group stops once, pod 1 leaves, pod 0 re-forms in its own process and pod 2
    receives its parameters. The job never ran smaller; one disruption, nothing charged."""
    epochs = 40
    jobs.apply(_draining_job("drain", epochs, tmp_path / "checkpoints", hold_until=1))
    pods = jobs.wait_running_pods("drain", 2, generation=0, timeout=300)
    survivor = next(p for p in pods if p.metadata.name == "drain-worker-0")
    _evict_after_epoch_3(jobs, "drain", "drain-worker-1")
    # Read while generation 1 runs: once the job finished, its pods may already be gone.
    jobs.wait("drain", lambda s: s.get("currentGeneration") == 1, "generation 1", timeout=300)
    pod0 = jobs.core.read_namespaced_pod("drain-worker-0", jobs.ns)
    assert pod0.metadata.uid == survivor.metadata.uid, "the survivor kept its pod"

    status = _wait_finished(jobs, kubelet, "drain")
    logs = {i: kubelet.log_of(f"drain-worker-{i}") for i in (0, 1, 2)}
    assert status["phase"] == "Succeeded", f"{jobs.describe('drain')}\n{logs}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (0, 1, 1)
    assert status["members"] == [0, 2], status
    reasons = [e.reason for e in jobs.core.list_namespaced_event(jobs.ns).items]
    assert {"ReplacingBeforeLeaving", "ReplacedBeforeLeaving"} <= set(reasons), reasons
    assert "ShrunkAfterDisruption" not in reasons, reasons
    drain = drain_seconds(DRAIN_GRACE)
    assert f"given notice; its workers train on for up to {drain}s" in logs[1], logs[1]
    assert "replaces this pod (drain-worker-1)" in logs[1], logs[1]
    firsts = _first_steps(logs[0], logs[2])
    assert firsts[(0, 0)][0] == firsts[(1, 0)][0], f"pod 0 kept its process\n{logs[0]}"
    assert firsts[(1, 1)][1] == firsts[(1, 0)][1], f"the replacement differs\n{logs}"
    assert f"done: {epochs} epochs, world size 2" in logs[0], logs[0]
    assert "rank 0 of 1 on" not in logs[0], f"the job never ran smaller\n{logs[0]}"


def test_deleting_the_job_stops_its_pods_at_the_next_report_without_the_drain(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """A KeepSurvivors job whose pods would drain 20 s after SIGTERM (``DRAIN_GRACE``) is deleted:
    no replacement will come, so each pod's runtime, following the job's watch, stops at its
    next report with a final checkpoint instead of training on."""
    jobs.apply(_draining_job("gone", 400, tmp_path / "checkpoints"))
    jobs.wait_running_pods("gone", 2, generation=0, timeout=300)
    _wait_epoch_3(jobs, "gone")
    jobs.kubectl("delete", "torchjob", "gone", "--wait=false")
    k.wait_for(
        lambda: not jobs.pods("gone"),
        120,  # a wait, not a bound
        lambda: f"the deleted job's pods to go\n{kubelet.log_of('gone')}",
        interval=0.5,
    )
    logs = {i: kubelet.log_of(f"gone-worker-{i}") for i in (0, 1)}
    said = {i: "\n".join(kubelet.termination_messages(f"gone-worker-{i}")) for i in (0, 1)}
    for i, log in logs.items():
        assert "the TorchJob is being deleted" in log, f"pod {i}\n{log}"
        # Each pod stops (exit 75), whichever pod's stop ended the others' group first (CI
        # 2026-12-03: pod 1's SIGTERM stopped the group; pod 0 waited, and failed).
        assert "training stopped on request" in said[i], f"pod {i}: {said[i]}\n{log}"
    stopped_at = re.search(r"latest checkpoint: (\S+)", said[0])
    assert stopped_at is not None and Path(stopped_at.group(1)).is_dir(), said[0]


def test_a_warm_standby_takes_the_evicted_pods_place_and_a_new_standby_starts(
    jobs: Jobs, kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    """elastic.standbyReplicas 1: pod 2 starts beside the two workers and waits. Pod 0 (rank
    0) is evicted: generation 1 is pods [1, 2] at once, pod 1 leads it in its own process and
    the standby receives the same parameters; pod 0 comes back as the new standby."""
    storage = tmp_path / "checkpoints"
    epochs = 40
    manifest = torchjob(
        "warm",
        replicas=2,
        backend="gloo",
        membershipPolicy="KeepSurvivors",
        elastic={"minReplicas": 2, "maxReplicas": 2, "standbyReplicas": 1},
        template=_e2e_template(str(epochs), "-1", "0.2", grace=30, hold_until=1),
        checkpoint={"path": str(storage)},
        failurePolicy={"maxRestarts": 0},
    )
    jobs.apply(manifest)
    jobs.wait(
        "warm",
        lambda s: s if s.get("standbyWorkers") == 1 else None,
        "the standby to wait, ready",
        timeout=400,
    )
    pods = {p.metadata.name: p for p in jobs.core.list_namespaced_pod(jobs.ns).items}
    assert set(pods) == {"warm-worker-0", "warm-worker-1", "warm-worker-2"}, set(pods)
    assert pods["warm-worker-2"].metadata.labels[contract.LABEL_JOINER] == "true"
    _evict_after_epoch_3(jobs, "warm", "warm-worker-0")
    jobs.wait(
        "warm",
        lambda s: (
            s if s.get("currentGeneration", 0) >= 1 and s.get("standbyWorkers") == 1 else None
        ),
        "the new standby (pod 0) to wait, ready",
        timeout=400,
    )

    status = _wait_finished(jobs, kubelet, "warm")
    logs = {i: kubelet.log_of(f"warm-worker-{i}") for i in (0, 1, 2)}
    assert status["phase"] == "Succeeded", f"{jobs.describe('warm')}\n{logs}"
    assert (status["restarts"], status["disruptions"], status["currentGeneration"]) == (0, 1, 1)
    assert status["members"] == [1, 2], status
    assert (
        pods["warm-worker-1"].metadata.uid
        == jobs.core.read_namespaced_pod("warm-worker-1", jobs.ns).metadata.uid
    ), "the survivor kept its pod"
    reasons = [e.reason for e in jobs.core.list_namespaced_event(jobs.ns).items]
    assert "StandbyTookOver" in reasons, reasons
    firsts = _first_steps(logs[1], logs[2])
    assert firsts[(0, 1)][0] == firsts[(1, 0)][0], f"pod 1 kept its process\n{logs[1]}"
    assert firsts[(1, 1)][1] == firsts[(1, 0)][1], f"the standby differs\n{logs}"
    assert "this pod waits to join" in logs[2], logs[2]
    assert f"done: {epochs} epochs, world size 2" in logs[1], logs[1]
    said = "".join(kubelet.termination_messages("warm-worker-0"))
    stops = re.findall(r"^torchjob: training stopped on request at report (\d+)", said)
    assert len(stops) >= 1, f"{said}\n{logs}"
    assert f"resumed from epoch {int(stops[0]) - 1} at generation 1" in logs[1], logs[1]
