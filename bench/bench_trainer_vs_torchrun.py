"""Time to first training step and steps/second: torchjob's TorchTrainer vs hand-written DDP under torchrun.

Same model, same synthetic data, same number of processes, gloo on CPU, run side
by side on this machine. Prints figures and ratios; asserts nothing.

    python bench/bench_trainer_vs_torchrun.py [--workers 2] [--steps 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

# The training step both sides run, kept in one place so they cannot drift apart.
STEP_CODE = textwrap.dedent(
    """
    import time, json, torch
    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 10))
        x = torch.randn(64, 256)
        y = torch.randint(0, 10, (64,))
        return model, x, y
    def loop(model, x, y, steps, warmup, out_path, rank):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        first = None
        for i in range(steps + warmup):
            if i == warmup:
                t_warm = time.time()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            if first is None:
                first = time.time()
        elapsed = time.time() - t_warm
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump({"first_step_at": first, "steps_per_s": steps / elapsed}, f)
    """
)

TORCHRUN_SCRIPT = STEP_CODE + textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo")
    model, x, y = make()
    loop(DistributedDataParallel(model), x, y, int(sys.argv[2]), 10, sys.argv[1], dist.get_rank())
    dist.destroy_process_group()
    """
)


def run_torchrun(workers: int, steps: int, tmp: Path) -> dict[str, float]:
    script = tmp / "ddp_script.py"
    script.write_text(TORCHRUN_SCRIPT)
    out = tmp / "torchrun.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={workers}", str(script), str(out), str(steps),
    ]  # fmt: skip
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = time.time() - t0
    data = json.loads(out.read_text())
    return {
        "first_step_s": data["first_step_at"] - t0,
        "steps_per_s": data["steps_per_s"],
        "total_s": total,
    }


TORCHJOB_SCRIPT = STEP_CODE + textwrap.dedent(
    """
    import sys, time
    t0 = time.time()
    import torchjob.train
    from torchjob.train import RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer, prepare_model

    def train_func(config):
        model, x, y = make()
        model = prepare_model(model)
        loop(model, x, y, config["steps"], 10, config["out"], torchjob.train.get_context().get_world_rank())
        torchjob.train.report({"done": 1})

    TorchTrainer(
        train_func,
        train_loop_config={"steps": int(sys.argv[2]), "out": sys.argv[1]},
        scaling_config=ScalingConfig(num_workers=int(sys.argv[3])),
        run_config=RunConfig(storage_path=sys.argv[4], progress=False),
    ).fit()
    """
)


def run_torchjob(workers: int, steps: int, tmp: Path) -> dict[str, float]:
    script = tmp / "torchjob_script.py"
    script.write_text(TORCHJOB_SCRIPT)
    out = tmp / "torchjob.json"
    t0 = time.time()
    cmd = [sys.executable, str(script), str(out), str(steps), str(workers), str(tmp / "runs")]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = time.time() - t0
    data = json.loads(out.read_text())
    return {
        "first_step_s": data["first_step_at"] - t0,
        "steps_per_s": data["steps_per_s"],
        "total_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    env_threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"TorchTrainer vs torchrun+DDP: {args.workers} workers, gloo/CPU, {args.steps} steps "
        f"(MLP 256-512-512-10, batch 64), {args.repeats} alternating repeats, OMP_NUM_THREADS={env_threads}"
    )
    runs: dict[str, list[dict[str, float]]] = {"torchrun": [], "torchjob": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for _ in range(args.repeats):
            runs["torchrun"].append(run_torchrun(args.workers, args.steps, tmp))
            runs["torchjob"].append(run_torchjob(args.workers, args.steps, tmp))
    med: dict[str, dict[str, Any]] = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    print(f"{'':10}{'first step (s)':>16}{'steps/s':>12}{'total (s)':>12}")
    for name in ("torchrun", "torchjob"):
        m = med[name]
        print(f"{name:10}{m['first_step_s']:>16.2f}{m['steps_per_s']:>12.1f}{m['total_s']:>12.2f}")
    tr, tj = med["torchrun"], med["torchjob"]
    print(
        f"ratios torchjob/torchrun: first step x{tj['first_step_s'] / tr['first_step_s']:.2f}, "
        f"steps/s x{tj['steps_per_s'] / tr['steps_per_s']:.2f}, total x{tj['total_s'] / tr['total_s']:.2f}"
    )


if __name__ == "__main__":
    main()
