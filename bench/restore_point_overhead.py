"""What the in-memory restore point costs a training loop without any loss, split in two.

Local ``TorchTrainer`` runs of ``--workers`` gloo workers training bench/goodput.py's
real-state workload (``--state-mib`` MiB of model and Adam state per worker, a fixed
``--step-seconds`` per step beside the compute that touches all of it), three loops:

* ``plain``: ``should_stop()`` every step, ``report()`` every ``--report-every`` steps, no
  state registered: the goodput benchmark's baseline without restore points;
* ``report``: the same, but ``get_preemption_info()`` and ``report()`` every step, still no
  state registered: the loop a restore point needs, without its copies;
* ``restore point``: ``report``'s loop with ``register_state``: the copies at the cadence the
  runtime chooses (``TORCHJOB_RESTORE_POINT_BUDGET``, 2 % by default).

The loops run in turn, ``--repeats`` rounds, so a slow spell of the machine falls on every
loop alike. Per loop: the mean step time (steps after the first ``--warmup``) of each round,
and its ratio to the same round's ``plain``; printed are the median over the rounds and the
spread (min-max). ``report`` / ``plain`` is what reporting every step costs, ``restore
point`` / ``report`` what the copies cost, ``restore point`` / ``plain`` both. Asserts
nothing.

    python bench/restore_point_overhead.py [--workers 8] [--state-mib 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _goodput_state

LOOPS = ("plain", "report", "restore point")


def _train(config: dict[str, Any]) -> None:
    import torch

    from torchjob.train import (
        get_context,
        get_preemption_info,
        register_state,
        report,
        should_stop,
    )
    from torchjob.train.torch import prepare_model

    rank = get_context().get_world_rank()
    torch.manual_seed(0)
    module, x = _goodput_state.build(config["state_mib"], 1)
    model = prepare_model(module)
    opt = _goodput_state.optimizer(config["state_mib"], model.parameters())
    state: dict[str, Any] = {"model": model, "opt": opt, "step": 0}
    loop = config["loop"]
    if loop == "restore point":
        register_state(state)
    every_step = loop != "plain"
    ends = []
    for step in range(1, config["steps"] + 1):
        time.sleep(config["step_seconds"])
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["step"] = step
        stop = should_stop()
        if every_step:
            get_preemption_info()
        if every_step or step % config["report_every"] == 0:
            report({"step": step})
        ends.append(time.monotonic())
        if stop:
            return
    if rank == 0:
        kept = ends[config["warmup"] :]
        steps = [b - a for a, b in itertools.pairwise(kept)]
        Path(config["out"]).write_text(json.dumps(statistics.mean(steps)))


def _run(args: argparse.Namespace, loop: str, out: Path) -> float:
    from torchjob.train import RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer

    config = {
        "loop": loop,
        "steps": args.steps,
        "warmup": args.warmup,
        "state_mib": args.state_mib,
        "step_seconds": args.step_seconds,
        "report_every": args.report_every,
        "out": str(out),
    }
    TorchTrainer(
        _train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(name="overhead", storage_path=str(out.parent / "runs")),
    ).fit()
    return float(json.loads(out.read_text()))


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--state-mib", type=int, default=256)
    p.add_argument("--step-seconds", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=45)
    p.add_argument("--warmup", type=int, default=5, help="first steps left out")
    p.add_argument("--report-every", type=int, default=10, help="the plain loop's reports")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    times: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(args.repeats):
            for loop in LOOPS:
                t = _run(args, loop, Path(d) / "step.json")
                times[loop].append(t)
                print(f"round {rep + 1}, {loop}: mean step {t * 1000:.0f} ms", flush=True)
    print(
        f"\n{args.workers} workers, {args.state_mib} MiB of state each, "
        f"{args.step_seconds:g} s sleep per step, {os.cpu_count()} CPUs; "
        f"median of {args.repeats} rounds (min-max)"
    )
    print(f"{'loop':<15}{'mean step (ms)':>22}{'vs plain':>26}{'vs report':>26}")
    for loop in LOOPS:
        ms = [t * 1000 for t in times[loop]]
        vs_plain = [t / b for t, b in zip(times[loop], times["plain"], strict=True)]
        vs_report = [t / b for t, b in zip(times[loop], times["report"], strict=True)]
        print(
            f"{loop:<15}{_spread(ms, '.0f'):>22}{_spread(vs_plain, '.3f'):>26}"
            f"{_spread(vs_report, '.3f'):>26}"
        )


if __name__ == "__main__":
    main()
