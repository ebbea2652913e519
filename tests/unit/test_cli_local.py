"""`torchjob run`: local pods get the env contract, failures stop the group, restarts obey the budget.

These run real subprocesses (plain Python, no torch) through the CLI's entry point.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchjob.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def write_job(
    tmp_path: Path,
    script: str,
    *,
    name: str = "demo",
    replicas: int = 2,
    extra_spec: dict[str, Any] | None = None,
    env: list[dict[str, str]] | None = None,
) -> Path:
    container: dict[str, Any] = {
        "name": "worker",
        "image": "python:3.12",
        "command": ["python", "-c"],
        "args": [textwrap.dedent(script)],
    }
    if env:
        container["env"] = env
    spec: dict[str, Any] = {"replicas": replicas, "template": {"spec": {"containers": [container]}}}
    spec.update(extra_spec or {})
    doc = {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": {"name": name},
        "spec": spec,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


DUMP_ENV = """
import json, os
keys = ["TORCHJOB_JOB_NAME", "TORCHJOB_POD_INDEX", "TORCHJOB_POD_NAME", "TORCHJOB_REPLICAS",
        "TORCHJOB_NPROC_PER_NODE", "TORCHJOB_GENERATION", "RANK", "WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "PET_NNODES", "LOCAL_WORLD_SIZE", "FROM_TEMPLATE"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
"""


def env_lines(out: str) -> dict[int, dict[str, str]]:
    seen = {}
    for line in out.splitlines():
        if line.startswith("[rank ") and " ENV " in line:
            prefix, payload = line.split(" ENV ", 1)
            seen[int(prefix[len("[rank ") : -1])] = json.loads(payload)
    return seen


def test_run_gives_each_local_pod_the_env_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_job(
        tmp_path, DUMP_ENV, replicas=3, env=[{"name": "FROM_TEMPLATE", "value": "yes"}]
    )
    assert main(["run", "-f", str(path)]) == 0
    envs = env_lines(capsys.readouterr().out)
    assert sorted(envs) == [0, 1, 2]
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for i, e in envs.items():
        assert e["TORCHJOB_JOB_NAME"] == "demo"
        assert e["TORCHJOB_POD_INDEX"] == str(i) == e["RANK"]
        assert e["TORCHJOB_POD_NAME"] == f"demo-worker-{i}"
        assert e["WORLD_SIZE"] == "3" == e["PET_NNODES"] == e["TORCHJOB_REPLICAS"]
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["TORCHJOB_GENERATION"] == "0"
        assert e["FROM_TEMPLATE"] == "yes"


def test_nproc_gpu_without_gpus_means_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = write_job(tmp_path, DUMP_ENV, replicas=2, extra_spec={"nprocPerNode": "gpu"})
    assert main(["run", "-f", str(path)]) == 0
    envs = env_lines(capsys.readouterr().out)
    assert {e["TORCHJOB_NPROC_PER_NODE"] for e in envs.values()} == {"1"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs.values()} == {"1"}


def test_failed_pod_stops_the_group_and_sets_the_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rank 0 would run for 10 minutes: only the group stop can end it.
    script = """
    import os, sys, time
    if os.environ["RANK"] == "1":
        print("rank 1 failing", flush=True)
        sys.exit(3)
    time.sleep(600)
    """
    path = write_job(tmp_path, script, extra_spec={"failurePolicy": {"maxRestarts": 0}})
    assert main(["run", "-f", str(path), "--grace-period", "5"]) == 3
    out = capsys.readouterr().out
    assert "[rank 1] rank 1 failing" in out
    assert "pod demo-worker-1 failed: exit code 3" in out


def test_failure_restarts_the_group_as_the_next_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = """
    import os, sys
    gen = os.environ["TORCHJOB_GENERATION"]
    print(f"gen={gen} restart_count={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
    sys.exit(7 if gen == "0" and os.environ["RANK"] == "0" else 0)
    """
    path = write_job(
        tmp_path,
        script,
        extra_spec={"failurePolicy": {"maxRestarts": 1, "backoff": {"initialSeconds": 0}}},
    )
    assert main(["run", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert "[rank 0] gen=1 restart_count=1" in out
    assert "[rank 1] gen=1 restart_count=1" in out
    assert "restarting the group as generation 1" in out


def test_restart_budget_is_honoured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_job(
        tmp_path,
        "import sys; sys.exit(5)",
        replicas=1,
        extra_spec={"failurePolicy": {"backoff": {"initialSeconds": 0}}},
    )
    assert main(["run", "-f", str(path), "--max-restarts", "2"]) == 5
    out = capsys.readouterr().out
    assert out.count("generation") >= 3
    assert "restarts used 2/2" in out


def test_example_manifest_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-f", str(REPO / "examples" / "local" / "hello.yaml")]) == 0
    out = capsys.readouterr().out
    assert "[rank 0] TORCHJOB_JOB_NAME=hello TORCHJOB_POD_INDEX=0" in out
    assert "[rank 1] TORCHJOB_JOB_NAME=hello TORCHJOB_POD_INDEX=1" in out
