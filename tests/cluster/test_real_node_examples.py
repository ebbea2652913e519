"""The docs' examples and a graceful eviction in real containers, on a real node.

The same harness as tests/cluster/test_real_node.py (the operator installed by Helm and running
on the real node, the workers in the CPU runtime image), in a module of its own so that
`make test` runs it in another session than the node-fault tests: hack/test.sh's ``pods``
session, whose cluster gets one real node beside the process kubelet. These tests need no
second node (their pods may share one), and the three-node session was the suite's long pole.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob
from tests.cluster.real_jobs import logs, real_template, wait_finished
from tests.cluster.realnode import REPO

from torchjob import tune
from torchjob.checkpoint import CheckpointStorage

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.realnode]


def test_evicted_worker_stops_every_rank_at_one_checkpoint_and_the_job_resumes(
    real_jobs: Jobs, storage: Path
) -> None:
    """The Eviction API deletes pod 1: its container gets SIGTERM from the kubelet, every rank
    stops at the same report after rank 0 committed, generation 1 resumes from there."""
    epochs = 40
    real_jobs.apply(
        torchjob(
            "spot",
            replicas=2,
            backend="gloo",
            template=real_template(storage, str(epochs), "-1", "0.3", grace=30),
            checkpoint={"path": str(storage)},
            failurePolicy={"maxRestarts": 0},
        )
    )
    real_jobs.wait(
        "spot",
        lambda s: s if (s.get("progress") or {}).get("epoch", -1) >= 2 else None,
        "rank 0 to report epoch 2",
        timeout=240,
    )
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="spot-worker-1"))
    real_jobs.core.create_namespaced_pod_eviction("spot-worker-1", real_jobs.ns, eviction)
    # The evicted container's own words, while the pod is terminating or just gone.
    status = wait_finished(real_jobs, "spot")
    out0 = logs(real_jobs, "spot-worker-0")
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('spot')}\n{out0}"
    assert (status["restarts"], status["disruptions"]) == (0, 1), status
    assert status["currentGeneration"] == 1
    resumed = re.search(r"resumed from epoch (\d+) at generation 1", out0)
    assert resumed, out0
    assert int(resumed.group(1)) >= 1, "generation 1 started from a checkpoint, not from 0"
    assert f"done: {epochs} epochs, world size 2" in out0


def test_the_fsdp_finetune_example_shrinks_and_grows_back_and_resumes_its_shards(
    real_jobs: Jobs, storage: Path
) -> None:
    """examples/finetune_fsdp/train.py (FSDP2, sharded async TrainState checkpoints) as its
    job.yaml's elastic TorchJob (KeepSurvivors, min 1, shrinkOnDisruption), at its smallest
    (2 pods x 1 rank, a one-block model): pod 1 is evicted after the first checkpoint, pod 0
    goes on alone from the shards both ranks wrote at the eviction, the replacement joins, the
    job grows back to 2 ranks, resharding again, and finishes at the last step."""
    example = REPO / "examples" / "finetune_fsdp"
    job = yaml.safe_load((example / "job.yaml").read_text())
    spec = job["spec"]
    # 0.6 s each: 90 s at 1 rank, twice that under CI's time scale (at load 16 the replacement
    # took longer than 90 s to start and join, and the job finished at 1 rank). Once grown back
    # the steps run at full speed (tests/e2e/finetune_until_grown.py): few and slow rather than
    # many and fast, since every step after the growth is CPU the test checks nothing with
    # (900 steps of 0.2 s cost 58 CPU-s alone, the most of any real-node test).
    steps, every = 150 * min(2, int(k.TIME_SCALE)), 15
    spec["nprocPerNode"] = 1
    spec["elastic"]["replaceBeforeLeaving"] = False  # the test is of resharding: 2 -> 1 -> 2
    spec["checkpoint"] = {"path": str(storage)}
    spec["failurePolicy"] = {"maxRestarts": 0}
    spec["template"] = real_template(
        storage,
        *("--steps", str(steps), "--checkpoint-every", str(every), "--layers", "1"),
        *("--dim", "32", "--batch", "4", "--samples", "512", "--step-seconds", "0.6"),
        grace=30,
        script="finetune_until_grown.py",
        env={"HOME": str(storage), "FINETUNE_DIR": str(example)},
    )
    pod = spec["template"]["spec"]
    pod["volumes"].append({"name": "example", "hostPath": {"path": str(example)}})
    mount = {"name": "example", "mountPath": str(example), "readOnly": True}
    pod["containers"][0]["volumeMounts"].append(mount)
    job["metadata"]["name"] = "ft"
    real_jobs.apply(job)
    real_jobs.wait(
        "ft",
        # progress.step counts reports (one per checkpoint here), metrics.step the loop's steps:
        # waiting for report 25 let 625 of the 900 steps pass before the eviction.
        lambda s: s if (s.get("progress") or {}).get("lastCheckpoint") else None,
        f"the first sharded checkpoint (step {every})",
        timeout=300,
    )
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="ft-worker-1"))
    real_jobs.core.create_namespaced_pod_eviction("ft-worker-1", real_jobs.ns, eviction)
    status = wait_finished(real_jobs, "ft", timeout=480 + steps * 0.2)
    out = logs(real_jobs, "ft-worker-0")
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('ft')}\n{out}"
    assert (status["restarts"], status["disruptions"]) == (0, 1), status
    reasons = real_jobs.event_reasons("ft")
    assert "ShrunkAfterDisruption" in reasons and "ScaledUp" in reasons, ", ".join(reasons)
    # Pod 0 was rank 0 throughout: it resumed from the shards at 1 rank, then at 2 again.
    resumes = [
        (int(step), int(world))
        for step, world in re.findall(r"resumed at step (\d+) from \S+ on (\d) workers", out)
    ]
    assert [w for _, w in resumes] == [1, 2], out
    assert every <= resumes[0][0] <= resumes[1][0] < steps, resumes
    reported = [int(m) for m in re.findall(r"'step': (\d+), 'workers'", out)]
    assert reported == sorted(reported) and reported[-1] == steps, reported
    assert f"'step': {steps}, 'workers': 2" in out, out
    assert "[finetune] greedy sample from the checkpoint" in out, out
    # What the example's README quotes (shown with pytest -s).
    print(*(f"event {e.reason}: {e.message}" for e in real_jobs.events("ft")), sep="\n")
    print(*(line for line in out.splitlines() if "resumed" in line or "'step'" in line), sep="\n")


def test_the_ray_train_quickstart_runs_as_a_torchjob(real_jobs: Jobs, storage: Path) -> None:
    """Seed 003 as shipped in examples/quickstart/train.py (the seed's code, imports mapped),
    in one pod of 2 processes: fit() returns the Result and the seed's step [6] loads the
    committed checkpoint from it."""
    real_jobs.apply(
        torchjob(
            "quick",
            replicas=1,
            nprocPerNode=2,
            backend="gloo",
            template=real_template(
                storage,
                script="train.py",
                scripts=REPO / "examples" / "quickstart",
                env={"HOME": str(storage), "QUICKSTART_EPOCHS": "3"},
            ),
            checkpoint={"path": str(storage)},
            failurePolicy={"maxRestarts": 0},
        )
    )
    status = wait_finished(real_jobs, "quick")
    out = logs(real_jobs, "quick-worker-0")
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('quick')}\n{out}"
    assert "'epoch': 2" in out, out
    assert re.search(r"\[quickstart\] loaded \S+ \(epoch 2, loss \d", out), out
    assert "[quickstart] primary: results in" in out, out


def test_the_tune_seeds_distributed_trainable_runs_as_a_torchjob(
    real_jobs: Jobs, storage: Path
) -> None:
    """Seed 001 (tests/e2e/seed_tune.py): the Tuner runs in the job's pod, every trial of its
    grid is a fresh 2-process gloo group in that container (DistributedTrainableCreator)."""
    real_jobs.apply(
        torchjob(
            "tune",
            replicas=1,
            backend="gloo",
            template=real_template(
                storage, str(storage / "results"), script="seed_tune.py", env={"HOME": str(storage)}
            ),
            failurePolicy={"maxRestarts": 0},
        )
    )
    status = wait_finished(real_jobs, "tune")
    out = logs(real_jobs, "tune-worker-0")
    assert status["phase"] == "Succeeded", f"{real_jobs.describe('tune')}\n{out}"
    assert "tune done: 2 trials, 0 errors, best lr 0.05, world size 2, iterations 3" in out, out
    # distributed_checkpoint_dir kept rank 0's checkpoint only, one per report.
    kept = sorted(p.name for p in (storage / "results").rglob("checkpoint") if p.is_file())
    assert kept == ["checkpoint"] * 6, kept


def test_a_torchtune_runs_the_tune_seeds_trainable_in_real_containers_to_the_best_checkpoint(
    real_jobs: Jobs, storage: Path
) -> None:
    """examples/tune/torchtune.yaml on the real node: the Helm-installed operator runs the
    study, each of the 4 trials is a TorchJob of 2 containers running examples/tune/trial.py
    (the Tune seed's trainable) in the runtime image, the threshold pruner deletes the trials
    whose loss is too high, and the best trial's committed checkpoint holds the trained model."""
    study = yaml.safe_load((REPO / "examples" / "tune" / "torchtune.yaml").read_text())
    spec = study["spec"]["trialTemplate"]["spec"]
    spec["checkpoint"] = {"path": str(storage)}
    spec["template"] = real_template(
        storage, script="trial.py", scripts=REPO / "examples" / "tune", env={"HOME": str(storage)}
    )
    real_jobs.apply(study)

    def finished() -> dict[str, Any] | None:
        obj = real_jobs.custom.get_namespaced_custom_object(
            "torchjob.io", "v1alpha1", real_jobs.ns, "torchtunes", "lr-search"
        )
        status: dict[str, Any] = obj.get("status") or {}
        if status.get("phase") == "Failed":
            return status
        # The best trial's checkpoint comes with its agent's last progress write, which may
        # land a moment after the trial's pods ended (the study then takes it).
        done = status.get("phase") == "Succeeded" and "checkpoint" in status.get("bestTrial", {})
        return status if done else None

    status = k.wait_for(
        finished, 540, "the TorchTune lr-search to finish with its best checkpoint", interval=2.0
    )
    assert status["phase"] == "Succeeded", status
    states = {t["params"]["lr"]: t["state"] for t in status["trials"]}
    assert states == {0.1: "Succeeded", 0.05: "Succeeded", 0.001: "Pruned", 0.0005: "Pruned"}, (
        status
    )
    assert (status["trialsCreated"], status["trialsSucceeded"], status["trialsPruned"]) == (4, 2, 2)
    # The Python SDK reads the same study back as Ray Tune's ResultGrid.
    handle = tune.attach(
        "lr-search", namespace=real_jobs.ns, kubeconfig=str(real_jobs.cluster.kubeconfig)
    )
    grid = handle.results()
    by_lr = {r.config["lr"]: r for r in grid}
    assert {lr: r.status for lr, r in by_lr.items()} == {
        0.1: "TERMINATED",
        0.05: "TERMINATED",
        0.001: "PRUNED",
        0.0005: "PRUNED",
    }, status["trials"]
    # The finished trials reported every epoch (6), the pruned ones were stopped early.
    assert by_lr[0.1].metrics["training_iteration"] == 6
    assert by_lr[0.001].metrics["training_iteration"] < 6
    # The best trial's checkpoint is its last committed one, and holds the trained model.
    best = grid.get_best_result()
    assert best.config["lr"] == 0.1 and best.job_name == status["bestTrial"]["name"]
    assert status["bestTrial"]["params"] == {"lr": 0.1}
    committed = CheckpointStorage(str(storage / best.job_name)).list_committed()
    # Seen once (2026-11-26): the best trial t0's checkpoint named t1's directory; what each
    # trial's TorchJob said is printed, so that a recurrence shows where the path came from.
    progress = {
        t["name"]: (real_jobs.status(t["name"]).get("progress") or {}).get("lastCheckpoint")
        for t in status["trials"]
    }
    assert status["bestTrial"]["checkpoint"] == committed[-1].path, (status, progress)
    assert best.checkpoint is not None and best.checkpoint.path == committed[-1].path
    import torch

    with best.checkpoint.as_directory() as d:
        weight = torch.load(Path(d) / "model.pt")["weight"].item()
    assert abs(weight - 3.0) < 0.1
    for lr in (0.001, 0.0005):
        name = by_lr[lr].job_name
        assert name is not None
        k.wait_for(lambda n=name: real_jobs.get(n) is None, 60, f"pruned TorchJob {name} deleted")
    table = real_jobs.kubectl("get", "tt", "lr-search").stdout
    assert "Succeeded" in table and "4/4" in table, table
