"""`torchjob run` through the installed console script: local pods form a real gloo group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.kube import scaled

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]


def torchjob_cli() -> list[str]:
    script = Path(sys.executable).parent / "torchjob"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torchjob.cli.main"]


def test_allreduce_example_forms_a_process_group_from_the_env_contract() -> None:
    proc = subprocess.run(
        [*torchjob_cli(), "run", "-f", str(REPO / "examples" / "local" / "allreduce.yaml")],
        capture_output=True,
        text=True,
        timeout=scaled(500),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "[rank 0] rank 0/2: all_reduce sum 1 ok" in lines
    assert "[rank 1] rank 1/2: all_reduce sum 1 ok" in lines
    assert lines[-1] == "[torchjob] job allreduce succeeded"


STOPPING_SCRIPT = """
import os, signal, time
import torchjob.train
from torchjob.train import RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer

def loop(config):
    ctx = torchjob.train.get_context()
    for step in range(4):
        if step == 2 and ctx.get_generation() == 0:
            # The pod is asked to stop (what the kubelet's SIGTERM does on a drain).
            os.kill(int(os.environ["TORCHJOB_LAUNCH_DRIVER_PID"]), signal.SIGTERM)
            while not torchjob.train.should_stop():
                time.sleep(0.05)
        torchjob.train.report({"step": step})

TorchTrainer(
    loop,
    scaling_config=ScalingConfig(num_workers=1),
    run_config=RunConfig(name="stop", storage_path=os.environ["RUN_DIR"]),
).fit()
print("generation", os.environ["TORCHJOB_GENERATION"], "done")
"""


def test_a_pod_stopped_on_request_exits_with_the_stop_code_and_is_never_charged(
    tmp_path: Path,
) -> None:
    """Defect 3: ``TrainingStoppedError`` leaves the user's script as exit code 75
    (``contract.STOPPED_EXIT_CODE``) with one line and no traceback, and ``torchjob run``
    reads it as stopped as asked: a new generation, no restart charged (``maxRestarts: 0``
    would end the job on a failure)."""
    import yaml

    from torchjob import contract

    script = tmp_path / "stop.py"
    script.write_text(STOPPING_SCRIPT)
    manifest = {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": {"name": "stop"},
        "spec": {
            "replicas": 1,
            "backend": "gloo",
            "failurePolicy": {"maxRestarts": 0},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "x",
                            "command": ["python", str(script)],
                            "env": [{"name": "RUN_DIR", "value": str(tmp_path / "runs")}],
                        }
                    ]
                }
            },
        },
    }
    path = tmp_path / "stop.yaml"
    path.write_text(yaml.safe_dump(manifest))
    proc = subprocess.run(
        [*torchjob_cli(), "run", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=scaled(500),
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    code = contract.STOPPED_EXIT_CODE
    assert f"stop-worker-0: stopped as asked (exit code {code})" in out, out
    assert "(0/0 restarts, 1 disruptions)" in out, out
    assert "[torchjob] training stopped on request at report 3" in out, out
    assert "Traceback" not in out and "failed" not in out, out
    assert "[rank 0] generation 1 done" in out, out
