"""Sharded checkpoints (``TrainState`` + ``Checkpoint.from_state``) on real gloo workers with
FSDP2: a save at 4 ranks loads at 2 and back at 4 with every parameter, optimizer moment,
step, scheduler and RNG state equal; a SIGKILL during an async save leaves the previous
checkpoint as the latest, and a corrupt, partial or half-written checkpoint is refused naming
the file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint.state_dict  # imported once here: the forked workers
import torch.distributed.fsdp  # inherit these instead of importing them each
from tests.kube import scaled, wait_for

from torchjob.checkpoint import CheckpointError, CheckpointStorage
from torchjob.train import CheckpointConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 10), torch.nn.Linear(10, 3)
    )


def _full(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The gathered model and optimizer state (for the test's comparison only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, opt, options=opts)
    return {"model": model_sd, "optim": optim_sd}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _train(config: dict[str, Any]) -> None:
    from torchjob.train import Checkpoint, TrainState, get_checkpoint, get_context, report
    from torchjob.train.torch import prepare_model

    rank = get_context().get_world_rank()
    out = Path(config["out"])
    model = prepare_model(_model(), parallel_strategy="fsdp")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    state = TrainState(model, opt, lr_scheduler=sched, extra={"note": "n"})
    loaded: dict[str, Any] = {}
    if (ckpt := get_checkpoint()) is not None:
        ckpt.load_state(state)
        full = _full(model, opt)
        if rank == 0:
            ref = torch.load(out / "ref.pt", weights_only=False)
            loaded = {
                "same_state": _equal(full, ref["full"]),
                "same_sched": sched.state_dict() == ref["sched"],
                "loaded_step": state.step,
            }
        rng_file = out / f"rng{rank}.pt"
        if rng_file.exists():  # this rank existed at save time: its own RNG is back
            loaded[f"same_rng{rank}"] = torch.equal(torch.rand(3), torch.load(rng_file))
        assert not rng_file.exists() or loaded[f"same_rng{rank}"], f"rank {rank}: RNG differs"
    for _ in range(config["steps"]):
        torch.manual_seed(100 + state.step * 10 + rank)
        model(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        state.step += 1
        report({"step": state.step, **loaded}, checkpoint=Checkpoint.from_state(state))
        loaded = {}
    full = _full(model, opt)  # the state of the last report's checkpoint
    for f in out.glob("rng*.pt"):
        if rank == 0:
            f.unlink()
    torch.distributed.barrier()
    torch.save(torch.rand(3), out / f"rng{rank}.pt")  # what this rank draws after the save
    if rank == 0:
        torch.save({"full": full, "sched": sched.state_dict()}, out / "ref.pt")


def _fit(tmp_path: Path, workers: int, steps: int, async_commit: bool) -> Any:
    return TorchTrainer(
        _train,
        train_loop_config={"steps": steps, "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name="sharded",
            storage_path=str(tmp_path),
            progress=False,
            checkpoint_config=CheckpointConfig(async_commit=async_commit, num_to_keep=2),
        ),
    ).fit()


def test_sharded_save_at_4_loads_at_2_and_back_at_4_with_the_same_state(tmp_path: Path) -> None:
    first = _fit(tmp_path, 4, 2, async_commit=True)
    assert first.error is None and first.metrics["step"] == 2
    storage = CheckpointStorage(str(tmp_path / "sharded"))
    latest = storage.latest_committed()
    assert latest is not None and latest.metrics["step"] == 2
    assert {f for f in latest.files if f.endswith(".distcp")} == {
        f"__{r}_0.distcp" for r in range(4)
    }, "every rank wrote its own shard file"

    shrunk = _fit(tmp_path, 2, 1, async_commit=False)  # 4 -> 2, synchronous saves
    resumed = shrunk.metrics_history[0]
    assert resumed["loaded_step"] == 2 and resumed["same_state"] and resumed["same_sched"]
    assert shrunk.metrics["step"] == 3

    grown = _fit(tmp_path, 4, 1, async_commit=True)  # 2 -> 4
    resumed = grown.metrics_history[0]
    assert resumed["loaded_step"] == 3 and resumed["same_state"] and resumed["same_sched"]
    assert [c.metrics["step"] for c in storage.list_committed()] == [3, 4]  # num_to_keep=2


_KILLED = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    import torch
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp
    import torchjob.train._sharded as sharded
    from torchjob.train import Checkpoint, RunConfig, ScalingConfig, TrainState
    from torchjob.train import get_checkpoint, get_context, report
    from torchjob.train.torch import TorchTrainer, prepare_model

    original_writer = sharded._writer

    def stall_after_writing(url):
        writer = original_writer(url)
        write = writer.write_data

        def write_data(plan, planner):
            done = write(plan, planner)  # this rank's shard is on disk now...
            done.wait()
            Path(sys.argv[2], f"wrote{get_context().get_world_rank()}").touch()
            threading.Event().wait()  # ... and the save never finishes: SIGKILL lands here
            return done

        writer.write_data = write_data
        return writer

    def train(config):
        torch.manual_seed(0)
        model = prepare_model(torch.nn.Linear(64, 64), parallel_strategy="fsdp")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = TrainState(model, opt)
        if (ckpt := get_checkpoint()) is not None:
            ckpt.load_state(state)
        start = state.step
        if get_context().get_world_rank() == 0:
            print("start", start, flush=True)
        for _ in range(2):
            model(torch.ones(2, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            state.step += 1
            if start == 0 and state.step == 2:
                sharded._writer = stall_after_writing  # the second save hangs mid-write
            report({"step": state.step}, checkpoint=Checkpoint.from_state(state))
        if get_context().get_world_rank() == 0:
            print("done", state.step, flush=True)
        if start == 0:
            threading.Event().wait()  # the test kills the run

    TorchTrainer(
        train,
        scaling_config=ScalingConfig(num_workers=int(sys.argv[3])),
        run_config=RunConfig(name="kill", storage_path=sys.argv[1], progress=False),
    ).fit()
    """
)


def test_sigkill_during_an_async_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    runs, signals = tmp_path / "runs", tmp_path / "signals"
    signals.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(runs), str(signals), "2"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["start", "0"]
        # Both ranks wrote their shard of step 2 and hang before the commit; report()
        # returned long before (the save is async), so training went on to "done".
        assert proc.stdout.readline().split() == ["done", "2"]
        wait_for(
            lambda: {p.name for p in signals.iterdir()} == {"wrote0", "wrote1"},
            timeout=120,
            message="both ranks wrote their shard of the second save",
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # every process of the run: a vanished node
        proc.wait(timeout=scaled(60))
    storage = CheckpointStorage(str(runs / "kill"))
    assert [c.metrics["step"] for c in storage.list_committed()] == [1]
    partial = [n for n in os.listdir(runs / "kill") if n.startswith(".tmp-checkpoint_")]
    assert len(partial) == 1 and os.listdir(runs / "kill" / partial[0]), "a half-written save"

    # The next run (at another world size) resumes from step 1, never from the partial save.
    done = subprocess.run(
        [sys.executable, "-c", _KILLED, str(runs), str(signals), "3"],
        capture_output=True,
        text=True,
        timeout=scaled(500),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["start", "1"]
    assert [c.metrics["step"] for c in storage.list_committed()][-1] == 3
    assert not [n for n in os.listdir(runs / "kill") if n.startswith(".tmp-")]


def test_a_corrupt_or_partial_sharded_checkpoint_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    """One process writes and loads (no process group): DCP's single-rank path, same checks."""
    from torchjob.checkpoint.sharded import commit_written, hash_files, new_target
    from torchjob.train import Checkpoint, TrainState

    storage = CheckpointStorage(str(tmp_path / "run"))
    target = new_target(storage)
    model = _model()
    import torch.distributed.checkpoint as dcp

    dcp.save(TrainState(model).state_dict(), checkpoint_id=target.write_url, no_dist=True)
    rels = sorted(os.listdir(target.write_url))
    commit_written(storage, target, hash_files(storage, target.write_url, rels), world_size=1)
    ckpt = Checkpoint(target.final_url)
    fresh = TrainState(_model(seed=1))
    assert not _equal(fresh.model.state_dict(), model.state_dict())
    ckpt.load_state(fresh)
    assert _equal(fresh.model.state_dict(), model.state_dict())

    shard = Path(target.final_url, "__0_0.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp does not match its checksum"):
        ckpt.load_state(fresh)
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has \d+ bytes.*truncated"):
        ckpt.load_state(fresh)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp listed in the manifest is missing"):
        ckpt.load_state(fresh)
    Path(target.final_url, "_COMMITTED").unlink()  # a save that did not finish: no marker
    with pytest.raises(CheckpointError, match=r"_COMMITTED is missing.*half-written"):
        ckpt.load_state(fresh)
