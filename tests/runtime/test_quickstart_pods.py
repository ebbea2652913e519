"""Seed 003's quickstart (examples/quickstart) under `torchjob run` with 2 pods: every pod's
fit() returns the same Result, so the seed's code after fit() runs on each of them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.kube import scaled
from tests.runtime.test_cli_run import REPO, torchjob_cli

pytestmark = pytest.mark.runtime


def test_quickstart_runs_unchanged_on_two_pods(tmp_path: Path) -> None:
    job = yaml.safe_load((REPO / "examples" / "quickstart" / "job.yaml").read_text())
    storage = tmp_path / "storage"
    job["spec"]["checkpoint"]["path"] = str(storage)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python", str(REPO / "examples" / "quickstart" / "train.py")]
    container["env"] = [{"name": "QUICKSTART_SAMPLES", "value": "256"}]
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    proc = subprocess.run(
        [*torchjob_cli(), "run", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=scaled(500),
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    loaded = re.findall(r"^\[rank (\d)\] \[quickstart\] loaded (\S+) \(epoch 1, ", out, re.M)
    # Both pods loaded the model from the same committed checkpoint: the last one.
    assert sorted(pod for pod, _ in loaded) == ["0", "1"], out
    assert {path for _, path in loaded} == {str(storage / "checkpoint_000002")}, out
    primary = re.findall(r"^\[rank (\d)\] \[quickstart\] primary", out, re.M)
    assert primary == ["0"], out
    assert "restart" not in out.lower(), out  # no pod failed, so the job never restarted
    assert proc.stdout.splitlines()[-1] == "[torchjob] job quickstart succeeded"
