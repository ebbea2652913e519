"""TorchTrainer.fit end to end on real processes: checkpoints, restarts, elasticity, stop, errors."""

from __future__ import annotations

import itertools
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import torchjob.train
from torchjob.checkpoint import CheckpointStorage
from torchjob.train import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    TrainingStoppedError,
)
from torchjob.train.torch import TorchTrainer, prepare_model


def _run_config(tmp_path: Path, **kwargs: Any) -> RunConfig:
    return RunConfig(name="run", storage_path=str(tmp_path / "storage"), progress=False, **kwargs)


def step_loop(config: dict[str, Any]) -> None:
    """Regression on fixed data; one report (with checkpoint) per step; resumes from the step saved.

    ``config["faults"]`` maps "generation:step" to an action on rank ``config["fault_rank"]``.
    """
    ctx = torchjob.train.get_context()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    step = 0
    ckpt = torchjob.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        getattr(model, "module", model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"] + 1
    while step < config["steps"]:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        action = config.get("faults", {}).get(f"{ctx.get_generation()}:{step}")
        if action and ctx.get_world_rank() == config.get("fault_rank", 1):
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif action == "raise":
                raise ValueError(f"injected failure at step {step}")
            elif action == "sigterm-driver":
                # The driver (a zygote-forked worker's parent is the zygote).
                os.kill(int(os.environ["TORCHJOB_LAUNCH_DRIVER_PID"]), signal.SIGTERM)
        if config.get("hold") == f"{ctx.get_generation()}:{step}":
            # Every rank waits here until the group is asked to stop (a resize): the run
            # cannot end before the driver's decision, however fast its reports are.
            while not torchjob.train.should_stop():
                time.sleep(0.05)
        log = Path(config["log_dir"]) / f"rank{ctx.get_world_rank()}-gen{ctx.get_generation()}.json"
        log.write_text(json.dumps({"last_step": step}))
        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {
                    "model": getattr(model, "module", model).state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                },
                os.path.join(d, "state.pt"),
            )
            torchjob.train.report(
                {"step": step, "loss": loss.item(), "world_size": ctx.get_world_size()},
                checkpoint=torchjob.train.Checkpoint.from_directory(d),
            )
        step += 1


def _config(tmp_path: Path, steps: int, **extra: Any) -> dict[str, Any]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    return {"steps": steps, "log_dir": str(log_dir), **extra}


def test_report_and_checkpoint_round_trip(tmp_path: Path) -> None:
    result = TorchTrainer(
        step_loop,
        train_loop_config=_config(tmp_path, 5),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(
            tmp_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    assert result.error is None
    assert [m["step"] for m in result.metrics_history] == [0, 1, 2, 3, 4]
    assert result.metrics is not None and result.metrics["step"] == 4
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3, 4]
    assert result.path == str(tmp_path / "storage" / "run")
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "state.pt"))["step"] == 4
    # Retention: the best by lowest loss (the last steps here) and the newest.
    assert [m["step"] for _, m in result.best_checkpoints] == [4, 3]
    restored = result.checkpoint.to_directory(str(tmp_path / "copy"))
    assert (Path(restored) / "state.pt").exists()


def test_killed_worker_restarts_group_and_loss_continues(tmp_path: Path) -> None:
    result = TorchTrainer(
        step_loop,
        train_loop_config=_config(tmp_path, 8, faults={"0:4": "kill"}),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, failure_config=FailureConfig(max_failures=1)),
    ).fit()
    steps = [m["step"] for m in result.metrics_history]
    losses = [m["loss"] for m in result.metrics_history]
    # Rank 1 died after step 4's update; rank 0 had committed step 3 and the group
    # resumed from it: no step lost, none repeated, and the loss keeps going down.
    assert steps == list(range(8)), steps
    assert result.world_sizes == [2, 2]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses


def test_elastic_shrinks_then_grows_back(tmp_path: Path) -> None:
    result = TorchTrainer(
        step_loop,
        # 3 ranks (not 4) prove the same: 11 worker starts became 8 (each imports torch and,
        # through DDP, torch._dynamo: about 6 s of CPU per worker).
        # Generation 1 (2 workers) holds at step 5 until the driver grows it back (after its
        # first checkpoint, steps 3 and 4).
        train_loop_config=_config(tmp_path, 10, faults={"0:2": "kill"}, fault_rank=2, hold="1:5"),
        scaling_config=ScalingConfig(num_workers=(2, 3), elastic_grow_cooldown_s=0),
        run_config=_run_config(tmp_path),  # max_failures=0: a lost worker is not charged
    ).fit()
    assert result.world_sizes == [3, 2, 3]
    sizes = [m["world_size"] for m in result.metrics_history]
    assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3
    assert [m["step"] for m in result.metrics_history] == list(range(10))


def test_failure_budget_exhausted_gives_root_cause(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError) as info:
        TorchTrainer(
            step_loop,
            train_loop_config=_config(tmp_path, 5, faults={"0:1": "raise", "1:2": "raise"}),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=_run_config(tmp_path, failure_config=FailureConfig(max_failures=1)),
        ).fit()
    first_line = str(info.value).splitlines()[0]
    assert first_line.startswith("rank 1 raised ValueError: injected failure at step 2"), first_line
    assert "max_failures=1" in str(info.value)
    assert info.value.result is not None
    # Rank 0 committed step 2 before rank 1 raised in generation 1: history has no repeats.
    assert [m["step"] for m in info.value.result.metrics_history] == [0, 1, 2]


def test_corrupt_checkpoint_error_names_path(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "storage" / "run"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "state.pt").write_bytes(b"not what the manifest says")
    ckpt = storage.commit(str(src))
    (Path(ckpt.path) / "state.pt").write_bytes(b"tampered")
    with pytest.raises(TrainingFailedError) as info:
        TorchTrainer(
            step_loop,
            train_loop_config=_config(tmp_path, 3),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=_run_config(tmp_path, failure_config=FailureConfig(max_failures=3)),
        ).fit()
    assert ckpt.path in str(info.value)
    assert "state.pt" in str(info.value)


def checkpoint_on_stop_loop(config: dict[str, Any]) -> None:
    """The loop docs/runtime.md gives: report every step, a checkpoint only at step 0 and when
    ``should_stop()`` says so. Rank 1 gets SIGTERM between its ``should_stop()`` and its
    ``report()`` at step ``config["term_at"]``: the moment that used to end the run at a report
    without a checkpoint."""
    ctx = torchjob.train.get_context()
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for step in range(config["steps"]):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        stop = torchjob.train.should_stop()
        if step == config["term_at"] and ctx.get_world_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        log = Path(config["log_dir"]) / f"rank{ctx.get_world_rank()}.json"
        log.write_text(json.dumps({"last_step": step}))
        if stop or step == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"step": step}, os.path.join(d, "state.pt"))
                torchjob.train.report(
                    {"step": step}, checkpoint=torchjob.train.Checkpoint.from_directory(d)
                )
        else:
            torchjob.train.report({"step": step})
        if stop:
            return


def _fit_until_stopped(loop: Any, config: dict[str, Any], tmp_path: Path) -> Any:
    """Two workers run ``loop`` until a SIGTERM stops them: the stopped run's Result."""
    with pytest.raises(TrainingStoppedError) as info:
        TorchTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=_run_config(tmp_path),
        ).fit()
    result = info.value.result
    assert result is not None and result.checkpoint is not None
    return result


def _last_steps(config: dict[str, Any], name: str) -> list[int]:
    """Each rank's last trained step, from the log file ``name`` (``{rank}`` filled in)."""
    logs = Path(config["log_dir"])
    return [json.loads((logs / name.format(rank=r)).read_text())["last_step"] for r in range(2)]


def _saved_step(result: Any) -> int:
    with result.checkpoint.as_directory() as d:
        return int(torch.load(os.path.join(d, "state.pt"))["step"])


def test_a_stop_between_should_stop_and_report_ends_at_the_loops_checkpoint(
    tmp_path: Path,
) -> None:
    # The stop arrives after should_stop() answered False: report() must not end the run
    # there (no checkpoint: every step since step 0 would be lost); the next should_stop()
    # says True on every rank and the loop saves the step it stops at.
    config = _config(tmp_path, 50, term_at=3)
    result = _fit_until_stopped(checkpoint_on_stop_loop, config, tmp_path)
    assert _last_steps(config, "rank{rank}.json") == [4, 4]
    assert _saved_step(result) == 4


def test_sigterm_stops_all_ranks_at_the_same_step_with_a_checkpoint(tmp_path: Path) -> None:
    config = _config(tmp_path, 50, faults={"0:3": "sigterm-driver"}, hold="0:4")
    result = _fit_until_stopped(step_loop, config, tmp_path)
    last = _last_steps(config, "rank{rank}-gen0.json")
    assert last[0] == last[1] < 49
    assert _saved_step(result) == last[0]
