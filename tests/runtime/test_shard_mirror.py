"""Elastic with sharded state (issue 27, item 2): the shard mirror on real gloo workers, FSDP2.

A ``TrainState`` of an FSDP2 model and AdamW is registered (``register_state``); every report
mirrors each rank's shard into its ring neighbour's memory. One run shrinks in place from 4
to 3 (world rank 1 SIGKILLed), to 2 (another rank SIGKILLed) and grows back to 4, each
re-formation rebuilt from the survivors' memory (the lost rank's shard from its mirror) with
no storage read although committed checkpoints exist; its parameters match an uninterrupted
single-process run over the same global batches. Losing a shard and its mirror together (two
adjacent ranks) falls back to the latest committed checkpoint, and the driver says so.

Tolerance: FSDP2 reduce-scatters each rank's gradient of its slice of the global batch and
averages them; the single-process reference takes the mean over the whole batch. Equal in
exact arithmetic, the float32 sums differ in order (and in how many partial sums) at each
world size, a few ulps per step; AdamW divides by the moments' square root, which keeps a
relative error of that order, so after 10 steps we allow ``rtol=1e-4, atol=1e-5``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint.state_dict  # imported once here: the workers import
import torch.distributed.fsdp  # this module, and with it these
from tests.kube import wait_for

import torchjob.launch
import torchjob.train
from torchjob.checkpoint import CheckpointStorage
from torchjob.train import (
    Checkpoint,
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainState,
)
from torchjob.train.recovery.shard_mirror import box
from torchjob.train.torch import TorchTrainer, prepare_model

STEPS = 10
BATCH = 12
"""Samples per step over the whole group (4, 3 and 2 ranks each take an equal slice)."""
LR = 0.05


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def initial_model() -> torch.nn.Module:
    torch.manual_seed(0)
    # 10 rows: uneven shards at 4 ranks (3, 3, 3, 1) and at 3 (4, 4, 2).
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))


def _full_params(model: torch.nn.Module) -> torch.Tensor:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return torch.cat([sd[k].flatten() for k in sorted(sd)])


def loop(config: dict[str, Any]) -> None:
    ctx = torchjob.train.get_context()
    rank, world, gen = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_generation()
    out = Path(config["dir"])
    model = prepare_model(initial_model(), parallel_strategy="fsdp")
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    state = TrainState(model, opt)
    from_memory = torchjob.train.register_state(state)
    for p in model.parameters():  # the mirror's own box is DTensor's, at every world size
        assert box(p.shape, p.device_mesh, p.placements)[0] == tuple(p.to_local().shape)
    ckpt = torchjob.train.get_checkpoint()
    if not from_memory and ckpt is not None:
        ckpt.load_state(state)
    (out / f"gen{gen}-rank{rank}.json").write_text(
        json.dumps(
            {"world": world, "first": state.step + 1, "memory": from_memory, "storage": bool(ckpt)}
        )
    )
    (out / f"pid{gen}-{rank}").write_text(str(os.getpid()))
    while state.step < STEPS:
        step = state.step + 1
        x, y = batch(step)
        n = BATCH // world
        torch.nn.functional.mse_loss(
            model(x[rank * n : (rank + 1) * n]), y[rank * n : (rank + 1) * n]
        ).backward()
        opt.step()
        opt.zero_grad()
        state.step = step
        save = Checkpoint.from_state(state) if step in config["checkpoint_at"] else None
        torchjob.train.report({"step": step, "world": world}, checkpoint=save)
        for g, s, r, after in config["kill"]:
            if (gen, step, rank) == (g, s, r):
                if after is not None:  # that rank goes first: both are lost
                    pid = int((out / f"pid{gen}-{after}").read_text())
                    wait_for(lambda p=pid: not _alive(p), timeout=60, message="rank gone")
                os.kill(os.getpid(), signal.SIGKILL)
        if (gen, step) == config.get("grow_after", (None, None)):
            # The controller grows the group once this generation committed a checkpoint: wait
            # for its stop, so that the next report is where the group leaves.
            wait_for(torchjob.launch.stop_requested, timeout=120, message="the grow's stop")
    params = _full_params(model)
    if rank == 0:
        torch.save(params, out / "final.pt")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by the driver) is gone for its peers too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def reference() -> torch.Tensor:
    model = initial_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    sd = model.state_dict()
    return torch.cat([sd[k].flatten() for k in sorted(sd)])


def _records(out: Path) -> dict[int, list[dict[str, Any]]]:
    gens: dict[int, list[dict[str, Any]]] = {}
    for f in sorted(out.glob("gen*-rank*.json")):
        g = int(f.name[3 : f.name.index("-")])
        gens.setdefault(g, []).append(json.loads(f.read_text()))
    return gens


def test_fsdp_shrinks_4_3_2_and_grows_to_4_from_the_mirror_without_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "dir": str(tmp_path),
        # Committed checkpoints exist: the mirror must win over them. Step 10 is saved after
        # the grow, by a survivor whose rank changed (rank 2 at 4 ranks, now rank 1).
        "checkpoint_at": [2, 7, 10],
        "kill": [(0, 3, 1, None), (1, 5, 2, None)],  # gen 0: rank 1 after step 3; gen 1: 2 after 5
        "grow_after": (2, 7),
    }
    result = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=(2, 4), elastic_grow_cooldown_s=0),
        run_config=RunConfig(
            name="mirror",
            storage_path=str(tmp_path / "runs"),
            checkpoint_config=CheckpointConfig(async_commit=False),
        ),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    ).fit()
    assert result.error is None
    gens = _records(tmp_path)
    assert [gens[g][0]["world"] for g in sorted(gens)] == [4, 3, 2, 4]
    assert [len(gens[g]) for g in sorted(gens)] == [4, 3, 2, 4]
    # The grow's stop lands at the report of step 7 (when the driver's signal arrives before
    # its all-reduce) or at the next one.
    for g, first in [(1, {4}), (2, {6}), (3, {8, 9})]:
        # Every rank of each re-formed group restored from memory (the replacements of the
        # grow included) at the step after the last report, and storage was not read.
        assert all(r["memory"] and not r["storage"] for r in gens[g]), gens[g]
        assert len({r["first"] for r in gens[g]}) == 1 and gens[g][0]["first"] in first
    log = "".join(capsys.readouterr())  # the driver's lines (stderr)
    assert log.count("resumed from the shard mirror") == 3, log
    # The report whose shards were rebuilt is the one whose step counter was restored (a
    # report per step: report N holds step N).
    grown = gens[3][0]["first"] - 1
    assert "(report 3, 4 -> 3 ranks, old rank(s) 1 from their mirror" in log
    assert "(report 5, 3 -> 2 ranks, old rank(s) 2 from their mirror" in log
    assert f"(report {grown}, 2 -> 4 ranks, old rank(s) none from their mirror" in log
    assert log.count("storage was not read") == 3
    torch.testing.assert_close(torch.load(tmp_path / "final.pt"), reference(), rtol=1e-4, atol=1e-5)
    # The grown group's sharded save committed every shard (a survivor's DTensor specs cached
    # in an earlier generation once held its old mesh coordinate: the save's plan failed).
    latest = CheckpointStorage(str(tmp_path / "runs" / "mirror")).list_committed()[-1]
    assert (latest.metrics["step"], latest.metrics["world"]) == (STEPS, 4), latest.metrics


def test_losing_a_shard_and_its_mirror_falls_back_to_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "dir": str(tmp_path),
        "checkpoint_at": [2],
        # After step 3 rank 2 dies, then rank 1, which holds rank 2's mirror.
        "kill": [(0, 3, 2, None), (0, 3, 1, 2)],
    }
    result = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(
            name="hole",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(async_commit=False),
        ),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    ).fit()
    assert result.error is None
    gens = _records(tmp_path)
    assert all(not r["memory"] and r["storage"] and r["first"] == 3 for r in gens[1]), gens
    log = "".join(capsys.readouterr())  # the driver's lines (stderr)
    assert "the shard mirror cannot rebuild report 3" in log, log
    assert "resuming from the latest committed checkpoint" in log
    torch.testing.assert_close(torch.load(tmp_path / "final.pt"), reference(), rtol=1e-4, atol=1e-5)
