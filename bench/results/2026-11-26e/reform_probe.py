"""The 5 s step of a re-formation, without torchjob: plain torch.distributed, forked processes.

W ranks form a gloo group three times in a row (generations 0, 1, 2), each on a new port where
rank 0 starts a new TCPStore server, as a re-formation does (and, with ``--late``, rank 0 gets
there late, as a survivor leaving a broken group does). Every rank prints, per generation, how
long its store client took to connect and how long ``init_process_group`` took.

    .venv/bin/python bench/results/2026-11-26e/reform_probe.py 32 [--late 0]

On this machine (2 cores, gVisor's runsc sandbox) at 32 ranks, generation 0 forms in
0.6-1.0 s, and generations 1 and 2 in 5.3-5.4 s (some ranks' store connection alone took 5.0 s,
or 10 s, and everybody waits for the last rank). At 8 ranks every generation forms in < 0.1 s.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
import torch.distributed as dist

BASE_PORT = 29700
GENERATIONS = 3


def rank_main(rank: int, world: int, late: float) -> None:
    timings = []
    servers = []
    for g in range(GENERATIONS):
        t0 = time.monotonic()
        if rank == 0:
            time.sleep(late)
            store = dist.TCPStore(
                "127.0.0.1", BASE_PORT + g, None, True, timedelta(seconds=60),
                wait_for_workers=False, use_libuv=True,
            )  # fmt: skip
            servers.append(store)
        else:
            store = dist.TCPStore(
                "127.0.0.1", BASE_PORT + g, None, False, timedelta(seconds=60), use_libuv=True
            )
        t1 = time.monotonic()
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"g{g}", store), rank=rank, world_size=world,
            timeout=timedelta(seconds=120),
        )  # fmt: skip
        t2 = time.monotonic()
        dist.all_reduce(torch.ones(4))
        dist.destroy_process_group()
        timings.append((g, t1 - t0, t2 - t1))
    if rank in (0, 1, world - 1):
        for g, connect, init in timings:
            print(f"rank {rank} gen {g}: store {connect:.2f}s init {init:.2f}s", flush=True)
    time.sleep(1)  # rank 0's servers outlive the others' last requests


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("world", type=int)
    p.add_argument("--late", type=float, default=0.0, help="rank 0 starts each store this late")
    args = p.parse_args()
    pids = []
    for r in range(args.world):
        pid = os.fork()
        if pid == 0:
            rank_main(r, args.world, args.late)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
