"""bench/goodput_jobs.py: Kubeflow's pods get the malloc thresholds torchjob's workers set
themselves (torchjob.launch.malloc), so the rows compare failure handling, not allocators."""

from __future__ import annotations

from pathlib import Path

from bench import goodput, goodput_jobs

from torchjob.launch import malloc


def test_kubeflow_pods_set_the_thresholds_torchjob_workers_set() -> None:
    args = goodput.parse_args(["--replicas", "8", "--state-mib", "256"])
    job = goodput_jobs.kubeflow_manifest(args, Path("/storage"), Path("/events.jsonl"))
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(malloc.MMAP_THRESHOLD)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(malloc.TRIM_THRESHOLD)
    # torchjob's own pods leave glibc's variables unset: their workers call mallopt.
    ours = goodput_jobs.manifest(args, "Elastic", Path("/storage"), Path("/events.jsonl"))
    trainer = ours["spec"]["template"]["spec"]["containers"][0]
    assert not {e["name"] for e in trainer["env"]} & set(malloc.USER_VARIABLES)
