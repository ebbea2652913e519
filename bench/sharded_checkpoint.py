"""Sharded checkpoints of an FSDP2 model: the save stall, synchronous vs asynchronous, and the
resume time at the same and at another world size (``TrainState`` + ``Checkpoint.from_state``).

A model of ``--gib`` GiB of float32 weights (``Linear(4096, 4096)`` layers, no bias) is built
on the meta device and sharded over ``--workers`` gloo ranks with ``fully_shard`` (each rank
allocates only its shard: ``--gib / --workers`` GiB, plus the same again for the async copy).
Four local ``TorchTrainer`` runs, the real ``report()`` and ``get_checkpoint()``:

1. ``async_commit=False``: ``--repeats`` reports with ``Checkpoint.from_state(state)``; the
   stall is how long ``report`` blocks (DCP writes and fsyncs every rank's shard, each rank
   hashes its file, rank 0 commits): the slowest rank's time, per save;
2. ``async_commit=True`` (the default): the same; ``report`` returns once the shard is copied
   into host memory (DCP ``async_save`` staging). The bench then waits for the background
   save before the next one and prints that time too (in a real loop it overlaps the steps);
3. resume at ``--workers`` ranks, 4. resume at ``--resume-workers`` ranks: ``load_state``
   ``--repeats`` times (verification of the files against the manifest, each rank a share,
   then DCP's resharding load), the slowest rank's time.

5. the shard mirror (``register_state(TrainState)``, ``torchjob.train.recovery.shard_mirror``):
   ``--repeats`` reports without a checkpoint, each timed (the copy of the rank's shard into
   its host buffer and the ring exchange), the bytes it holds per rank; then world rank 1 is
   SIGKILLed and the group (``num_workers=(W-1, W)``) shrinks in place: the time from the
   kill to the state loaded in the next generation (failure detection, re-formation, the
   model's construction, the rebuild from the survivors' memory);
6. the same kill with the mirror off (``TORCHJOB_SHARD_MIRROR=0``) and a checkpoint at the
   last report: the same time, to the state loaded from storage at ``W-1`` ranks.

Prints medians with min-max, and the async/sync ratio (the issue's target: < 0.10). The
checkpoint files were just written, so resume reads mostly from the page cache. Asserts nothing.

    python bench/sharded_checkpoint.py [--gib 2] [--workers 4] [--resume-workers 2]
                                       [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from torchjob.train import CheckpointConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer

DIM = 4096


def _model(gib: float) -> Any:
    import torch
    from torch.distributed.fsdp import fully_shard

    layers = max(1, round(gib * 2**30 / (DIM * DIM * 4)))
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(DIM, DIM, bias=False) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_()
    return model


def _slowest(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _save(config: dict[str, Any]) -> None:
    from torchjob.train import Checkpoint, TrainState, _session, get_context, report

    state = TrainState(_model(config["gib"]))
    stalls, background = [], []
    for i in range(config["repeats"]):
        state.step = i + 1
        t = time.perf_counter()
        report({"i": i}, checkpoint=Checkpoint.from_state(state))
        stalls.append(_slowest(time.perf_counter() - t))
        t = time.perf_counter()
        session = _session.current()
        assert session is not None
        session.drain()  # the bench's own measurement: when did the background save land?
        background.append(_slowest(time.perf_counter() - t))
    if get_context().get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps({"stall": stalls, "background": background}))


def _resume(config: dict[str, Any]) -> None:
    from torchjob.train import TrainState, get_checkpoint, get_context

    ckpt = get_checkpoint()
    assert ckpt is not None and ckpt.is_sharded, "the save runs left a sharded checkpoint"
    state = TrainState(_model(config["gib"]))
    times = []
    for _ in range(config["repeats"]):
        t = time.perf_counter()
        ckpt.load_state(state)
        times.append(_slowest(time.perf_counter() - t))
    assert state.step == config["repeats"], state.step
    if get_context().get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps({"load": times}))


def _lose(config: dict[str, Any]) -> None:
    """Reports (timing the mirror), then world rank 1 dies; the next generation restores."""
    import torch.distributed as dist

    from torchjob.train import (
        Checkpoint,
        TrainState,
        get_checkpoint,
        get_context,
        register_state,
        report,
        shard_mirror,
    )

    ctx = get_context()
    rank = ctx.get_world_rank()
    out = Path(config["out"])
    state = TrainState(_model(config["gib"]))
    t = time.perf_counter()
    from_memory = register_state(state)
    if ctx.get_generation() > 0:
        if not from_memory and (ckpt := get_checkpoint()) is not None:
            ckpt.load_state(state)
        restore_s = _slowest(time.perf_counter() - t)
        if rank == 0:
            killed = float((out.parent / "killed").read_text())
            out.write_text(
                json.dumps(
                    {
                        **json.loads((out.parent / "gen0.json").read_text()),
                        "reform_s": time.time() - killed,
                        "restore_s": restore_s,
                        "from_memory": from_memory,
                        "step": state.step,
                    }
                )
            )
        return
    reports, takes = [], []
    for i in range(config["repeats"]):
        state.step = i + 1
        last = i == config["repeats"] - 1
        save = Checkpoint.from_state(state) if last and not config["mirror"] else None
        dist.barrier()  # every rank starts the report together: its time is the report's own
        t = time.perf_counter()
        report({"i": i}, checkpoint=save)
        reports.append(_slowest(time.perf_counter() - t))
        held = shard_mirror.held()
        takes.append(_slowest(held.seconds if held is not None else 0.0))
    held = shard_mirror.held()
    nbytes = held.nbytes if held is not None else 0
    if rank == 0:
        (out.parent / "gen0.json").write_text(
            json.dumps({"report": reports, "take": takes, "bytes": nbytes})
        )
    dist.barrier()
    if rank == 1:
        (out.parent / "killed").write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()  # fails when rank 1 is gone: the survivors re-form


def _run(
    fn: Any,
    args: argparse.Namespace,
    root: str,
    workers: int | tuple[int, int],
    async_commit: bool,
    mirror: bool = True,
) -> Any:
    out = Path(root, "out.json")
    TorchTrainer(
        fn,
        train_loop_config={
            "gib": args.gib,
            "repeats": args.repeats,
            "out": str(out),
            "mirror": mirror,
        },
        scaling_config=ScalingConfig(num_workers=workers, elastic_grow_cooldown_s=3600),
        run_config=RunConfig(
            name="sharded",
            storage_path=root,
            progress=False,
            checkpoint_config=CheckpointConfig(num_to_keep=1, async_commit=async_commit),
        ),
    ).fit()
    return json.loads(out.read_text())


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.2f}s ({min(xs):.2f}-{max(xs):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--resume-workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    args = p.parse_args()
    # A rank building or copying a large shard on a loaded machine can hold the GIL past the
    # heartbeat's threshold: the bench measures the loss it causes itself, not silent peers.
    os.environ.setdefault("TORCHJOB_SILENT_PEER_S", "0")
    root = tempfile.mkdtemp(prefix="bench-sharded-", dir=args.dir)
    try:
        sync = _run(_save, args, root, args.workers, async_commit=False)
        asyn = _run(_save, args, root, args.workers, async_commit=True)
        same = _run(_resume, args, root, args.workers, async_commit=True)
        other = _run(_resume, args, root, args.resume_workers, async_commit=True)
        w = args.workers
        shutil.rmtree(Path(root, "sharded"), ignore_errors=True)
        mirror = _run(_lose, args, root, (w - 1, w), async_commit=False)
        shutil.rmtree(Path(root, "sharded"), ignore_errors=True)
        os.environ["TORCHJOB_SHARD_MIRROR"] = "0"
        try:
            storage = _run(_lose, args, root, (w - 1, w), async_commit=False, mirror=False)
        finally:
            del os.environ["TORCHJOB_SHARD_MIRROR"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    w, rw = args.workers, args.resume_workers
    ratio = statistics.median(asyn["stall"]) / statistics.median(sync["stall"])
    print(
        f"sharded checkpoint of an FSDP2 model: {args.gib:g} GiB of float32 weights over {w} gloo "
        f"ranks ({args.gib / w:g} GiB each), {args.repeats} repeats, median (min-max)"
    )
    rows = [
        (f"save stall, sync  ({w} ranks)", _fmt(sync["stall"])),
        (f"save stall, async ({w} ranks)", _fmt(asyn["stall"])),
        ("  async: background until committed", _fmt(asyn["background"])),
        ("  async/sync stall ratio (target < 0.10)", f"{ratio:7.3f}"),
        (f"resume, same world size ({w} -> {w})", _fmt(same["load"])),
        (f"resume, other world size ({w} -> {rw})", _fmt(other["load"])),
        (f"lose rank 1 ({w} -> {w - 1}), re-form: mirror", f"{mirror['reform_s']:7.2f}s"),
        ("  of which the rebuild from memory", f"{mirror['restore_s']:7.2f}s"),
        (f"lose rank 1 ({w} -> {w - 1}), re-form: storage", f"{storage['reform_s']:7.2f}s"),
        ("  of which the load from storage", f"{storage['restore_s']:7.2f}s"),
        ("  mirror/storage re-form ratio", f"{mirror['reform_s'] / storage['reform_s']:7.3f}"),
        ("mirror: its copy + exchange per report", _fmt(mirror["take"])),
        ("  report() with the mirror", _fmt(mirror["report"])),
        ("  report() without it (no checkpoint)", _fmt(storage["report"][:-1])),
        (
            f"mirror: host memory per rank (shard {args.gib / w:g} GiB)",
            f"{mirror['bytes'] / 2**30:7.3f} GiB",
        ),
    ]
    for name, value in rows:
        print(f"{name:<44} {value}")


if __name__ == "__main__":
    main()
