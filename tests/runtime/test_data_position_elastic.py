"""The data position across a shrink and a grow, on real worker processes (issue 16).

Three gloo workers read a shuffled dataset through ``prepare_data_loader``; a worker is
SIGKILLed mid-epoch, the group goes on with two, then grows back to three, each time from
the latest checkpoint. Every step's samples are logged per rank; over the steps whose
checkpoint was committed (the result's history), each epoch's samples are exactly the
dataset: none skipped, and repeated only by the sampler's padding, at most ``W - 1`` per
world size the epoch ran at (docs/runtime.md, "Data position and its bound").
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import torchjob.train
from torchjob.train import RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, prepare_data_loader, prepare_model

SAMPLES = 100
"""Not a multiple of 2 x 4 or 3 x 4: the sampler pads, and the bound is exercised."""
BATCH = 4
EPOCHS = 3
KILL_AT = (0, 1, 5)
"""(generation, epoch, step of the epoch) at which world rank 2 SIGKILLs itself."""


def data_loop(config: dict[str, Any]) -> None:
    ctx = torchjob.train.get_context()
    rank, generation = ctx.get_world_rank(), ctx.get_generation()
    model = prepare_model(torch.nn.Linear(1, 1))
    data = TensorDataset(torch.arange(SAMPLES, dtype=torch.float32))
    loader = prepare_data_loader(DataLoader(data, batch_size=BATCH, shuffle=True))
    epoch, step = 0, 0
    ckpt = torchjob.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        epoch, step = state["epoch"], state["step"]  # re-enter the same epoch: the loader skips
    log = Path(config["log_dir"]) / f"rank{rank}-gen{generation}.jsonl"
    in_generation = 0
    while epoch < EPOCHS:
        loader.sampler.set_epoch(epoch)
        for in_epoch, (x,) in enumerate(loader, start=1):
            model(x.unsqueeze(1)).sum().backward()
            step += 1
            with log.open("a") as f:
                f.write(json.dumps({"step": step, "ids": [int(v) for v in x.tolist()]}) + "\n")
            if (generation, epoch, in_epoch) == KILL_AT and rank == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            in_generation += 1
            if generation == 1 and in_generation == 3:
                # The smaller group waits here (after two checkpoints) until the driver grows
                # it back: the grow happens mid-epoch whatever the speed of the reports.
                while not torchjob.train.should_stop():
                    time.sleep(0.05)
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save({"epoch": epoch, "step": step}, os.path.join(d, "state.pt"))
                torchjob.train.report(
                    {
                        "step": step,
                        "epoch": epoch,
                        "generation": generation,
                        "world_size": ctx.get_world_size(),
                    },
                    checkpoint=torchjob.train.Checkpoint.from_directory(d),
                )
        epoch += 1


def _logged(log_dir: Path) -> dict[tuple[int, int], list[int]]:
    """(generation, step) -> the samples every rank of that generation took at that step."""
    out: dict[tuple[int, int], list[int]] = {}
    for path in log_dir.glob("rank*-gen*.jsonl"):
        generation = int(path.stem.split("-gen")[1])
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault((generation, rec["step"]), []).extend(rec["ids"])
    return out


def test_no_sample_skipped_or_repeated_beyond_the_bound_across_shrink_and_grow(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    result = TorchTrainer(
        data_loop,
        train_loop_config={"log_dir": str(log_dir)},
        scaling_config=ScalingConfig(num_workers=(2, 3), elastic_grow_cooldown_s=0),
        run_config=RunConfig(name="run", storage_path=str(tmp_path / "storage"), progress=False),
    ).fit()
    assert result.error is None
    assert result.world_sizes[:3] == [3, 2, 3], result.world_sizes
    history = result.metrics_history
    steps = [m["step"] for m in history]
    assert steps == list(range(1, len(steps) + 1)), "every step committed once, in order"
    logged = _logged(log_dir)
    per_epoch: dict[int, list[int]] = {}
    sizes: dict[int, set[int]] = {}
    for m in history:
        per_epoch.setdefault(m["epoch"], []).extend(logged[(m["generation"], m["step"])])
        sizes.setdefault(m["epoch"], set()).add(m["world_size"])
    assert sorted(per_epoch) == list(range(EPOCHS))
    assert sizes[1] == {2, 3}, "epoch 1 ran at 3, then 2 after the loss, then 3 again"
    for epoch, ids in per_epoch.items():
        counts = Counter(ids)
        skipped = set(range(SAMPLES)) - set(counts)
        assert not skipped, f"epoch {epoch}: samples {sorted(skipped)} skipped"
        # Only the epoch's last segment reaches the padded tail of the sampler's order: at
        # most W - 1 repeats, within the documented W_old - 1 + W_new - 1.
        repeats = len(ids) - SAMPLES
        assert 0 <= repeats <= max(sizes[epoch]) - 1, f"epoch {epoch}: {repeats} repeats"
