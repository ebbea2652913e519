"""What the in-memory restore point costs, and what it saves after a hard loss.

Local ``TorchTrainer`` runs of ``--workers`` gloo workers training an MLP (``--hidden`` x
``--layers``, SGD with momentum: the restore point holds the parameters and the momentum),
reporting every step:

* ``plain``: no state registered (the restore point off);
* ``restore point``: ``register_state`` on, so every report copies the state into host memory;
* ``kill, memory``: ``register_state`` on, world rank 1 SIGKILLed after report ``--kill-at``:
  the survivors stay, a replacement process starts, the group re-forms in place and resumes
  from a survivor's memory;
* ``kill, storage``: no state registered, a checkpoint (``torch.save`` of the state, rank 0,
  committed in the background) every ``--ckpt-every`` steps, the same kill: the group
  re-forms in place (survivors kept) and resumes from the latest committed checkpoint;
* ``shrink, memory`` / ``shrink, storage``: the same two with ``num_workers=(1, W)``: the
  survivors go on without the lost rank, so no new process starts and the recovery is the
  re-formation and the restore alone.

Per row: the median step time (steps 3.. of generation 0), the worker's peak RSS, and for
the kill rows the time from the kill to the training function's start in the next
generation (detection, re-formation, a replacement's start, the restore: ``to restart``),
the recovery (the kill to the end of the first step of the next generation, less one median
step), the steps lost (reported again) and the cost (the recovery plus the lost steps).
Prints a table; asserts nothing.

    python bench/restore_point.py [--workers 2] [--hidden 1024] [--layers 4] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torchjob.train
from torchjob.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, prepare_model


def _train(config: dict[str, Any]) -> None:
    import torch

    ctx = torchjob.train.get_context()
    rank, generation = ctx.get_world_rank(), ctx.get_generation()
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(config["layers"]):
        layers += [torch.nn.Linear(config["hidden"], config["hidden"]), torch.nn.ReLU()]
    model = prepare_model(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 0}
    if config["register"]:
        torchjob.train.register_state(state)
    elif (ckpt := torchjob.train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            saved = torch.load(f"{d}/state.pt")
        getattr(model, "module", model).load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state["step"] = saved["step"]
    log = Path(config["out"]) / f"rank{rank}.jsonl"
    if generation > 0 and rank == 0:
        (Path(config["out"]) / "entered").write_text(str(time.time()))
    x = torch.randn(32, config["hidden"])
    while state["step"] < config["steps"]:
        t0 = time.time()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        state["step"] += 1
        step = state["step"]
        ckpt_dir = None
        if config["ckpt_every"] and step % config["ckpt_every"] == 0:
            ckpt_dir = tempfile.mkdtemp()
            if rank == 0:
                torch.save(
                    {
                        "model": getattr(model, "module", model).state_dict(),
                        "optimizer": opt.state_dict(),
                        "step": step,
                    },
                    f"{ckpt_dir}/state.pt",
                )
        torchjob.train.report(
            {"step": step},
            checkpoint=Checkpoint.from_directory(ckpt_dir) if ckpt_dir else None,
        )
        with log.open("a") as f:
            f.write(
                json.dumps(
                    {"gen": generation, "step": step, "t0": t0, "t1": time.time(), "rss": _hwm()}
                )
                + "\n"
            )
        if config["kill_at"] and generation == 0 and step == config["kill_at"] and rank == 1:
            with (Path(config["out"]) / "kill").open("w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


def _hwm() -> int:
    """This process's peak resident set (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run(
    args: argparse.Namespace, name: str, *, register: bool, kill: bool, shrink: bool = False
) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"restore-point-{name.replace(' ', '-')}-"))
    config = {
        "hidden": args.hidden,
        "layers": args.layers,
        "steps": args.steps,
        "register": register,
        "kill_at": args.kill_at if kill else 0,
        "ckpt_every": 0 if register else args.ckpt_every if kill else 0,
        "out": str(out),
    }
    trainer = TorchTrainer(
        _train,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=(args.workers - 1, args.workers) if shrink else args.workers,
            elastic_grow_cooldown_s=3600,
        ),
        run_config=RunConfig(
            name=name.replace(" ", "-").replace(",", ""),
            storage_path=str(out / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    trainer.fit()
    rows = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    gen0 = [r for r in rows if r["gen"] == 0][2:]
    step_s = statistics.median(r["t1"] - r["t0"] for r in gen0)
    hwm = max(json.loads(line)["rss"] for line in (out / "rank0.jsonl").read_text().splitlines())
    result: dict[str, Any] = {"name": name, "step_s": step_s, "rss": hwm, "recovery_s": None}
    if kill:
        killed_at = float((out / "kill").read_text())
        result["restart_s"] = float((out / "entered").read_text()) - killed_at
        after = [r for r in rows if r["gen"] > 0]
        result["recovery_s"] = after[0]["t1"] - killed_at - step_s
        result["lost"] = args.kill_at - (after[0]["step"] - 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--kill-at", type=int, default=17)
    p.add_argument("--ckpt-every", type=int, default=10)
    args = p.parse_args()
    params = args.layers * (args.hidden * args.hidden + args.hidden)
    state_mib = 2 * params * 4 / 2**20  # parameters + momentum, float32
    print(
        f"restore point: {args.workers} gloo workers, MLP {args.layers}x{args.hidden} "
        f"({params / 1e6:.1f}M params, state {state_mib:.0f} MiB with momentum), a report "
        f"every step; kill of rank 1 after step {args.kill_at}; storage: a checkpoint every "
        f"{args.ckpt_every} steps",
        flush=True,
    )
    print(
        f"{'run':<16}{'step (s)':>10}{'vs plain':>10}{'peak RSS':>12}{'to restart':>12}"
        f"{'recovery':>10}{'lost':>6}{'cost':>9}",
        flush=True,
    )
    runs = [
        ("plain", {"register": False, "kill": False}),
        ("restore point", {"register": True, "kill": False}),
        ("kill, memory", {"register": True, "kill": True}),
        ("kill, storage", {"register": False, "kill": True}),
        ("shrink, memory", {"register": True, "kill": True, "shrink": True}),
        ("shrink, storage", {"register": False, "kill": True, "shrink": True}),
    ]
    base = None
    for name, how in runs:
        r = run(args, name, **how)
        base = base or r["step_s"]
        rec = f"{r['recovery_s']:.2f}s" if r["recovery_s"] is not None else "-"
        restart = f"{r['restart_s']:.2f}s" if "restart_s" in r else "-"
        lost = str(r.get("lost", "-"))
        cost = (
            f"{r['recovery_s'] + r['lost'] * r['step_s']:.2f}s"
            if r["recovery_s"] is not None
            else "-"
        )
        print(
            f"{r['name']:<16}{r['step_s']:>10.3f}{r['step_s'] / base:>9.2f}x"
            f"{r['rss'] / 2**20:>9.0f}MiB{restart:>12}{rec:>10}{lost:>6}{cost:>9}",
            flush=True,
        )
    print("cost: the recovery plus the lost steps' time (redone after the restore)")


if __name__ == "__main__":
    main()
