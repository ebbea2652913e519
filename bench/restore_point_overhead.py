"""What the in-memory restore point costs a training loop without any loss, split in two.

Local ``TorchTrainer`` runs of ``--workers`` gloo workers training bench/goodput.py's
real-state workload (``--state-mib`` MiB of model and Adam state per worker, a fixed
``--step-seconds`` per step beside the compute that touches all of it), three loops:

* ``plain``: ``should_stop()`` every step, ``report()`` every ``--report-every`` steps, no
  state registered: the goodput benchmark's baseline without restore points;
* ``report``: the same, but ``get_preemption_info()`` and ``report()`` every step, still no
  state registered: the loop a restore point needs, without its copies;
* ``restore point``: ``report``'s loop with ``register_state``: the copies at the cadence the
  runtime chooses (``TORCHJOB_RESTORE_POINT_BUDGET``, 2 % by default);
* ``restore point k=1``: the same with a copy at every report (``TORCHJOB_RESTORE_POINT_EVERY=1``):
  what one copy costs the step, whatever the budget would choose;
* ``in place``: ``restore point`` with ``register_state(..., in_place=True)``, the goodput
  benchmark's loop: DDP's gradient all-reduce goes through torchjob's comm hook
  (``recovery.in_place``), and the optimizers' step hooks (``recovery.step_undo``);
* ``in place bv``: the same with DDP's ``gradient_as_bucket_view=True`` (the gradients are
  views into the all-reduce buckets: no copy into them at each backward).

Per loop also the cadence the runtime chose (a restore point every ``k`` reports: a loss
then costs up to ``k - 1`` steps) and what it measured a copy to cost the loop (its lower
median, the overlapped part's wait included).

``--gpu``: one worker per GPU (nccl), the state on the GPU, ``--rows`` input rows per step
so that the step's compute is real (``--step-seconds 0``): the copies are then device to
host, page-locked and on a side stream (``torchjob.train.recovery.device_copy``).

    python bench/restore_point_overhead.py --gpu --workers 1 --state-mib 4096 --rows 8192 \
        --step-seconds 0 --steps 60 --warmup 10

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
import contextlib
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _goodput_state

LOOPS = ("plain", "report", "restore point", "restore point k=1", "in place", "in place bv")
LOOP_OF = {
    "restore point k=1": "restore point",
    "in place": "restore point",
    "in place bv": "restore point",
}
"""The training loop each row runs (``restore point k=1`` is ``restore point``'s, with a copy
at every report)."""


def _train(config: dict[str, Any]) -> None:
    import torch

    from torchjob.train import (
        get_context,
        get_preemption_info,
        register_state,
        report,
        should_stop,
    )
    from torchjob.train.torch import get_device, prepare_model

    rank = get_context().get_world_rank()
    torch.manual_seed(0)
    module, x = _goodput_state.build(config["state_mib"], 1)
    bucket_view = {"gradient_as_bucket_view": True} if config["bucket_view"] else None
    model = prepare_model(module, parallel_strategy_kwargs=bucket_view)
    device = get_device()
    # On a GPU the step's compute is real (``--rows`` rows through every layer), not a sleep.
    x = (
        torch.randn(config["rows"], x.shape[1], device=device)
        if config["rows"] > 1
        else x.to(device)
    )
    # The step's own kernels (its stream), as a loop's ``loss.item()`` waits for them; not
    # ``torch.cuda.synchronize()``, which would wait for the restore point's side stream too.
    sync = torch.cuda.current_stream().synchronize if device.type == "cuda" else (lambda: None)
    opt = _goodput_state.optimizer(config["state_mib"], model.parameters())
    state: dict[str, Any] = {"model": model, "opt": opt, "step": 0}
    loop = config["loop"]
    if loop == "restore point":
        register_state(state, in_place=config["in_place"])
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
        sync()  # a GPU's queued work is part of the step
        ends.append(time.monotonic())
        if stop:
            return
    if rank == 0:
        kept = ends[config["warmup"] :]
        steps = [b - a for a, b in itertools.pairwise(kept)]
        from torchjob.train import _session  # the cadence the runtime chose, for the table

        cadence = _session.current().cadence  # type: ignore[union-attr]
        out = {"step_s": statistics.mean(steps), "every": cadence.every, "copy_s": cadence.copy_s}
        Path(config["out"]).write_text(json.dumps(out))


def _run(args: argparse.Namespace, loop: str, out: Path) -> dict[str, float]:
    from torchjob.train import RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer

    config = {
        "loop": LOOP_OF.get(loop, loop),
        "in_place": loop.startswith("in place"),
        "bucket_view": loop == "in place bv",
        "steps": args.steps,
        "warmup": args.warmup,
        "state_mib": args.state_mib,
        "step_seconds": args.step_seconds,
        "report_every": args.report_every,
        "rows": args.rows,
        "out": str(out),
    }
    TorchTrainer(
        _train,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpu),
        run_config=RunConfig(name="overhead", storage_path=str(out.parent / "runs")),
    ).fit()
    return dict(json.loads(out.read_text()))


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
    p.add_argument("--gpu", action="store_true", help="one worker per GPU (nccl), state on it")
    p.add_argument("--rows", type=int, default=1, help="input rows per step (a GPU's compute)")
    p.add_argument("--loops", default=",".join(LOOPS), help="the loops to run, in turn")
    args = p.parse_args()
    loops = [loop for loop in LOOPS if loop in args.loops.split(",")]
    runs: dict[str, list[dict[str, float]]] = {loop: [] for loop in loops}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(args.repeats):
            for loop in loops:
                with _every(loop):
                    r = _run(args, loop, Path(d) / "step.json")
                runs[loop].append(r)
                print(
                    f"round {rep + 1}, {loop}: mean step {r['step_s'] * 1000:.1f} ms, restore "
                    f"point every {r['every']} reports, a copy {r['copy_s'] * 1000:.1f} ms",
                    flush=True,
                )
    where = f"{args.workers} GPU(s)" if args.gpu else f"{args.workers} workers"
    print(
        f"\n{where}, {args.state_mib} MiB of state each, {args.rows} input rows, "
        f"{args.step_seconds:g} s sleep per step, {os.cpu_count()} CPUs; "
        f"median of {args.repeats} rounds (min-max)"
    )
    print(
        f"{'loop':<20}{'mean step (ms)':>22}{'vs plain':>24}{'vs report':>24}"
        f"{'every k':>10}{'copy (ms)':>22}"
    )
    for loop in loops:
        t = [r["step_s"] for r in runs[loop]]
        vs_plain = [a / r["step_s"] for a, r in zip(t, runs.get("plain", runs[loop]), strict=True)]
        vs_report = [
            a / r["step_s"] for a, r in zip(t, runs.get("report", runs[loop]), strict=True)
        ]
        copies = [r["copy_s"] * 1000 for r in runs[loop]]
        print(
            f"{loop:<20}{_spread([x * 1000 for x in t], '.1f'):>22}"
            f"{_spread(vs_plain, '.3f'):>24}{_spread(vs_report, '.3f'):>24}"
            f"{statistics.median(r['every'] for r in runs[loop]):>10g}"
            f"{_spread(copies, '.1f'):>22}"
        )


@contextlib.contextmanager
def _every(loop: str) -> Iterator[None]:
    """``restore point k=1``: a copy at every report, whatever the budget says."""
    if loop != "restore point k=1":
        yield
        return
    os.environ["TORCHJOB_RESTORE_POINT_EVERY"] = "1"
    try:
        yield
    finally:
        del os.environ["TORCHJOB_RESTORE_POINT_EVERY"]


if __name__ == "__main__":
    main()
