"""How long ``report(..., checkpoint=...)`` stalls the training loop: a synchronous commit vs a
background one (torchjob.checkpoint.background), for a state of ``--gib`` GiB (default 1).

Both save the state with ``torch.save`` into a temporary directory first (the user's code);
then the synchronous path runs ``CheckpointStorage.commit`` (copy, fsync, sha256, rename,
marker) while the loop waits, and the background path hard-links the files and returns, the
commit running on a thread. Prints the stall of each (median of ``--repeats``) and how long the
background commit took after it returned. Asserts nothing.

    python bench/checkpoint_stall.py [--gib 1] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

from torchjob.checkpoint import CheckpointStorage
from torchjob.checkpoint.background import BackgroundCommitter


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args()
    state = {"w": torch.randn(int(args.gib * 2**30 / 4))}
    root = tempfile.mkdtemp(prefix="torchjob-stall-", dir=args.dir)
    sync, bg, bg_commit, saves = [], [], [], []
    try:
        storage = CheckpointStorage(os.path.join(root, "run"))
        committer = BackgroundCommitter(storage)
        for _ in range(args.repeats):
            for mode in ("sync", "background"):
                t = time.perf_counter()
                with tempfile.TemporaryDirectory(dir=root) as d:
                    torch.save(state, os.path.join(d, "state.pt"))
                    saves.append(time.perf_counter() - t)
                    if mode == "sync":
                        storage.commit(d, metrics={})
                    else:
                        committer.submit(d, metrics={})
                stall = time.perf_counter() - t
                if mode == "sync":
                    sync.append(stall)
                else:
                    bg.append(stall)
                    committer.wait()
                    bg_commit.append(time.perf_counter() - t - stall)
                storage.apply_retention(1)  # keep the disk use at one state
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    print(
        f"checkpoint of {args.gib:g} GiB, median of {args.repeats} (torch.save alone {med(saves):.2f}s)"
    )
    print(f"  synchronous report stall   {med(sync):6.2f}s")
    print(
        f"  background report stall    {med(bg):6.2f}s  (commit finished {med(bg_commit):.2f}s later)"
    )
    print(f"  stall ratio                {med(bg) / med(sync):6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
