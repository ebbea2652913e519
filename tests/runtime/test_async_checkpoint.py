"""``report(..., checkpoint=...)`` with background commits (``CheckpointConfig.async_commit``,
the default): every reported checkpoint lands, in order, before ``fit()`` returns, and a
worker SIGKILLed while its commits are in flight never leaves a checkpoint that looks
committed and is not complete; the next run resumes from the latest complete one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.kube import scaled

from torchjob.checkpoint import CheckpointStorage
from torchjob.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer


def _train(config: dict) -> None:
    import tempfile

    from torchjob.train import get_checkpoint, get_context, report

    start = 0
    if (ckpt := get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(Path(d, "step.txt").read_text()) + 1
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            if get_context().get_world_rank() == 0:
                for j in range(4):
                    Path(d, f"part{j}.bin").write_bytes(bytes([step % 256]) * config["size"])
                Path(d, "step.txt").write_text(str(step))
            report({"step": step}, checkpoint=Checkpoint.from_directory(d))


@pytest.mark.parametrize("async_commit", [True, False])
def test_every_reported_checkpoint_is_committed_in_order_before_fit_returns(
    tmp_path: Path, async_commit: bool
) -> None:
    result = TorchTrainer(
        _train,
        train_loop_config={"steps": 6, "size": 2 << 20},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="bg",
            storage_path=str(tmp_path),
            progress=False,
            checkpoint_config=CheckpointConfig(async_commit=async_commit),
        ),
    ).fit()
    storage = CheckpointStorage(str(tmp_path / "bg"))
    committed = storage.list_committed()
    assert [c.metrics["step"] for c in committed] == list(range(6))
    for c in committed:
        files = storage.read_files(c)  # verifies each checksum against the manifest
        assert files["part3.bin"] == bytes([c.metrics["step"]]) * (2 << 20)
    assert result.checkpoint is not None and result.checkpoint.path == committed[-1].path
    assert [m["step"] for m in result.metrics_history] == list(range(6))
    assert not [n for n in os.listdir(tmp_path / "bg") if n.startswith(".tmp-")]


def test_a_run_resumed_from_storage_by_a_new_driver_goes_on_with_the_runs_report_count(
    tmp_path: Path,
) -> None:
    """Each committed checkpoint's manifest says the run's report number it was taken at.
    A driver that has seen none of the run's reports (every pod of a job replaced, or a new
    ``fit()`` of the same run) resumes from storage and counts on from the checkpoint's
    number: before, it counted from 0, and the job's status said the job started over."""

    def fit(steps: int) -> None:
        TorchTrainer(
            _train,
            train_loop_config={"steps": steps, "size": 1024},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="count", storage_path=str(tmp_path), progress=False),
        ).fit()

    storage = CheckpointStorage(str(tmp_path / "count"))
    fit(4)
    assert [(c.metrics["step"], c.report) for c in storage.list_committed()] == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 4),
    ]
    fit(6)  # resumes at step 4 from the checkpoint of report 4
    assert [(c.metrics["step"], c.report) for c in storage.list_committed()[-2:]] == [
        (4, 5),
        (5, 6),
    ]


_RUN = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path
    from torchjob.train import Checkpoint, RunConfig, ScalingConfig, get_checkpoint, report
    from torchjob.train.torch import TorchTrainer

    def train(config):
        start = 0
        if (ckpt := get_checkpoint()) is not None:
            with ckpt.as_directory() as d:
                start = int(Path(d, "step.txt").read_text()) + 1
        print("start", start, os.getpid(), flush=True)
        for step in range(start, 10_000):
            with tempfile.TemporaryDirectory() as d:
                for j in range(6):
                    Path(d, f"part{j}.bin").write_bytes(bytes([step % 256]) * 3_000_000)
                Path(d, "step.txt").write_text(str(step))
                report({"step": step}, checkpoint=Checkpoint.from_directory(d))
            print("reported", step, flush=True)  # its commit runs in the background now
            if step == start + config["more"]:
                return

    TorchTrainer(
        train,
        train_loop_config={"more": int(sys.argv[2])},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="kill", storage_path=sys.argv[1], progress=False),
    ).fit()
    """
)


def test_a_worker_sigkilled_during_background_commits_leaves_only_complete_checkpoints(
    tmp_path: Path,
) -> None:
    storage = CheckpointStorage(str(tmp_path / "kill"))
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN, str(tmp_path), "1000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    _, start, pid = proc.stdout.readline().split()
    assert int(start) == 0
    for _ in range(3):
        line = proc.stdout.readline()
        assert line.startswith("reported"), line
    os.kill(int(pid), signal.SIGKILL)  # the worker, mid-commit: a vanished node
    # A SIGKILL is a disruption, not the job's failure (torchjob.rules.loss): the run goes on
    # with a new worker, from the last checkpoint that committed whole.
    line = proc.stdout.readline()
    while line.startswith("reported"):  # the killed worker's last words
        line = proc.stdout.readline()
    assert line.startswith("start"), line
    _, again, new_pid = line.split()
    assert int(new_pid) != int(pid)
    proc.terminate()  # the run stops on request (SIGTERM), charged nothing
    proc.wait(timeout=scaled(120))
    committed = storage.list_committed()
    assert committed, "report() waits for the previous commit: the first one landed"
    steps = {c.metrics["step"] for c in committed}
    assert int(again) - 1 in steps, (again, sorted(steps))  # it restored a whole one
    for c in committed:
        files = storage.read_files(c)  # a partial one would fail its checksums
        assert len(files) == 7
        assert files["part5.bin"] == bytes([c.metrics["step"] % 256]) * 3_000_000
    resumed_at = committed[-1].metrics["step"] + 1
    # The run finishes from there (it removes the incomplete copies first).
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path), "2"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"start {resumed_at} ")
    assert storage.list_committed()[-1].metrics["step"] == resumed_at + 2
    assert not [n for n in os.listdir(tmp_path / "kill") if n.startswith(".tmp-")]
