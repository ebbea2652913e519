"""The 5 s step of a re-formation is new store connections: plain torch.distributed, forked.

W ranks form a gloo group three times in a row on one TCPStore that rank 0 serves for all
three (each generation under its own key prefix). ``reuse``: every rank keeps its store
client across generations; ``fresh``: every rank connects a new client per generation, as
torchjob did before 2026-11-26m. Every rank prints, per generation, how long its store client
took and how long ``init_process_group`` took.

    .venv/bin/python bench/results/2026-11-26m/reuse_probe.py 32 reuse|fresh

On this machine (2 cores, gVisor's runsc sandbox) at 32 ranks: ``fresh`` forms generations 1
and 2 in 5.0-5.3 s (some ranks' store connection took 5 s, the same with
``use_libuv=False``), ``reuse`` in 0.07-0.12 s; at 64 ranks ``reuse`` re-forms in 0.3-0.5 s.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
import torch.distributed as dist

PORT = 29800
GENERATIONS = 3


def rank_main(rank: int, world: int, mode: str) -> None:
    timings = []
    server = client = None
    for g in range(GENERATIONS):
        t0 = time.monotonic()
        if rank == 0:
            if server is None:
                server = dist.TCPStore(
                    "127.0.0.1", PORT, None, True, timedelta(seconds=60), wait_for_workers=False
                )
            store = server
        else:
            if client is None or mode == "fresh":
                client = dist.TCPStore("127.0.0.1", PORT, None, False, timedelta(seconds=60))
            store = client
        t1 = time.monotonic()
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"g{g}", store), rank=rank, world_size=world,
            timeout=timedelta(seconds=120),
        )  # fmt: skip
        t2 = time.monotonic()
        dist.all_reduce(torch.ones(4))
        dist.destroy_process_group()
        timings.append((g, t1 - t0, t2 - t1))
        store.add(f"done{g}", 1)  # every rank leaves before the next generation forms
        while int(store.add(f"done{g}", 0)) < world:
            time.sleep(0.01)
    if rank in (0, 1, world - 1):
        for g, connect, init in timings:
            print(f"{mode} rank {rank} gen {g}: store {connect:.2f}s init {init:.2f}s", flush=True)
    time.sleep(1)  # rank 0's server outlives the others' last requests


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("world", type=int)
    p.add_argument("mode", choices=("reuse", "fresh"))
    args = p.parse_args()
    pids = []
    for r in range(args.world):
        pid = os.fork()
        if pid == 0:
            rank_main(r, args.world, args.mode)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
