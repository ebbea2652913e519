"""Sharded (DCP) checkpoints on a real S3-compatible object store (SeaweedFS, tests/s3.py):
DCP's fsspec writer puts the shards straight into ``checkpoint_N/``, the manifest and the
``_COMMITTED`` marker go last, and ``Checkpoint.load_state`` verifies and reads them back.
One process, no process group (DCP's single-rank path: the same storage code as every rank's)."""

from __future__ import annotations

import pytest
import torch
from tests.s3 import S3

from torchjob.checkpoint import MARKER, CheckpointError, CheckpointStorage
from torchjob.train import Checkpoint, TrainState
from torchjob.train._sharded import ShardedSaver


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))


def test_sharded_async_checkpoint_round_trip_on_an_object_store(s3: S3) -> None:
    background = True  # the synchronous path writes and commits the same way, in the caller
    url = s3.url("runs", "sharded")
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    saver = ShardedSaver(url, rank=0, world_size=1)
    done = saver.save(
        TrainState(model, opt, step=7),
        metrics={"loss": 1.5},
        data_positions=[],
        background=background,
    )
    if background:
        assert done is None
        done = saver.wait()
    assert done is not None and done.path == s3.url("runs", "sharded", "checkpoint_000001")
    assert {".metadata", "__0_0.distcp"} <= set(done.files)
    latest = CheckpointStorage(url).latest_committed()
    assert latest is not None and latest.metrics == {"loss": 1.5}

    fresh = TrainState(other := _model(1), torch.optim.AdamW(other.parameters()))
    ckpt = Checkpoint(done.path)
    assert ckpt.is_sharded
    ckpt.load_state(fresh)
    assert fresh.step == 7
    for a, b in zip(other.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)

    fs = s3.server.fs()
    key = f"{s3.bucket}/runs/sharded/checkpoint_000001/__0_0.distcp"
    fs.pipe_file(key, fs.cat_file(key)[:-8])  # a truncated shard is refused, naming the file
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has \d+ bytes.*truncated"):
        ckpt.load_state(fresh)
    fs.rm(f"{s3.bucket}/runs/sharded/checkpoint_000001/{MARKER}")
    assert CheckpointStorage(url).latest_committed() is None  # without its marker: not one
