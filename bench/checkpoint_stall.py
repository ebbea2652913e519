"""How long ``report(..., checkpoint=...)`` stalls the training loop, synchronous vs asynchronous
commits (``CheckpointConfig(async_commit=False)`` vs the default), for a state of ``--gib`` GiB.

One local ``TorchTrainer`` run per mode (1 worker, the real ``report()``): the training function
holds a ``--gib`` GiB state and checkpoints it ``--repeats`` times the way docs/runtime.md tells
users to (``torch.save`` into a new temporary directory, then ``report`` with the checkpoint).
The stall is the time from the start of ``torch.save`` to ``report`` returning: with
``async_commit=False`` it includes the commit (copy, fsync, sha256, rename, marker); by default
``report`` hard-links the files and returns, the commit running on a thread. For the
asynchronous mode it also prints how long the commit ran after ``report`` returned (measured by
waiting for it before the next save: in a real loop that time overlaps the steps). Prints
medians and the ratio. Asserts nothing.

    python bench/checkpoint_stall.py [--gib 1] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from torchjob.train import CheckpointConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer


def _train(config: dict[str, Any]) -> None:
    import torch

    from torchjob.train import Checkpoint, _session, report

    state = {"w": torch.randn(int(config["gib"] * 2**30 / 4))}
    out = Path(config["out"])
    for i in range(config["repeats"]):
        t = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=config["scratch"]) as d:
            torch.save(state, os.path.join(d, "state.pt"))
            saved = time.perf_counter() - t
            report({"i": i}, checkpoint=Checkpoint.from_directory(d))
        stall = time.perf_counter() - t
        t = time.perf_counter()
        session = _session.current()
        assert session is not None
        session.drain()  # the bench's own measurement: when did the background commit land?
        landed = time.perf_counter() - t
        with out.open("a") as f:
            f.write(json.dumps({"save": saved, "stall": stall, "landed": landed}) + "\n")


def _run(mode: str, args: argparse.Namespace, root: str) -> list[dict[str, float]]:
    out = Path(root) / f"{mode}.jsonl"
    TorchTrainer(
        _train,
        train_loop_config={
            "gib": args.gib,
            "repeats": args.repeats,
            "out": str(out),
            "scratch": root,
        },
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(
            name=mode,
            storage_path=root,
            progress=False,
            checkpoint_config=CheckpointConfig(num_to_keep=1, async_commit=mode == "async"),
        ),
    ).fit()
    return [json.loads(line) for line in out.read_text().splitlines()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="torchjob-stall-", dir=args.dir)
    try:
        sync = _run("sync", args, root)
        shutil.rmtree(os.path.join(root, "sync"), ignore_errors=True)
        bg = _run("async", args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(
        f"report() with a checkpoint of {args.gib:g} GiB, 1 worker, median of {args.repeats}"
        f" (torch.save alone {med(sync + bg, 'save'):.2f}s)"
    )
    print(f"  async_commit=False  stall {med(sync, 'stall'):6.2f}s")
    print(
        f"  async_commit=True   stall {med(bg, 'stall'):6.2f}s"
        f"  (its commit landed {med(bg, 'landed'):.2f}s after report returned)"
    )
    print(f"  stall ratio                {med(bg, 'stall') / med(sync, 'stall'):6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
