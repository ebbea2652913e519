"""How a hard loss's recovery grows with the world size (issue 26, item 1: the scale curve).

Local ``TorchTrainer`` runs of W gloo workers (W = ``--sizes``, default 2, 8, 32, 64) on this
machine: processes, not pods, so that 64 ranks fit where a node could not hold 64 pods. Each
run trains a tiny MLP (``--hidden``; the curve measures the coordination cost of a recovery,
not the restore of a large state: see bench/restore_point.py for that) with ``register_state``
on and a report every step, and SIGKILLs one rank at a given report, ``--losses`` times (a
random non-zero rank, or rank 0: rank 0 serves the rendezvous store, so its loss is another
path). The survivors re-form in place (``WorkerGroup.heal`` + ``reform``, as a KeepSurvivors
pod does) and resume from their memory:

* ``replace``: a fixed-size group; a new process joins (forked from the driver) and receives
  the restore point by broadcast;
* ``shrink``: ``num_workers=(W - losses, W)``: the survivors go on without the lost rank.

Each victim is SIGKILLed at a random moment of a step (a timer armed at the step's start,
at a seeded fraction of its median step: in the compute, DDP's all-reduce or the report's
collective). Recovery: the kill to the end of the first step of the next generation, no step
subtracted (issue 39). A loss whose recovery needed a second re-formation, resumed from
storage instead of the survivors' memory, or never came, is a failed re-formation: counted
in the table's ``n/failed`` and said on the row's ``each:`` line, never dropped.
Its phases, from the driver's and rank 0's clocks (one machine): ``detect`` (the kill -> the
driver's wait raised), ``replace`` (``heal``: the dead reaped, a new process started and
connected; reaping only when shrinking), ``reform`` (every rank leaves the old group and joins
the new one: rendezvous and gloo's connections), ``restore`` (-> ``register_state`` returned:
the function sent, the ranks agree on the restore point, it is broadcast and loaded), ``DDP``
(-> ``prepare_model`` returned), ``first step`` (-> its end) and
``other`` (the rest: the controller's decisions between them).

Prints a table (world size, p50, p95, lost steps, the median of each phase) and writes the
curve (recovery p50/p95 against world size, log x) as SVG to ``--out``. Asserts nothing.
``OMP_NUM_THREADS=1``; workers are forked from this process, which must hold no other thread.

    python bench/recovery_scale.py [--sizes 2,8,32,64] [--losses 5] [--modes replace,shrink]
    make bench-scale
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("OMP_NUM_THREADS", "1")
# c10d warns of every store a lost rank 0 served
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchjob.train
from bench.harness import mem_available_gib, pct
from bench.recovery_scale_report import (
    PHASES,
    TARGET_S,
    Loss,
    analyse,
    each_line,
    row_line,
    write_curve,
)
from torchjob.launch import LaunchError, WorkerGroup
from torchjob.launch.execution import Execution
from torchjob.train import FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchConfig, TorchTrainer, prepare_model

# ------------------------------------------------------------------------------ the workers


def victim(kill: int, world_size: int, who: str, seed: int) -> int:
    """The rank killed at the ``kill``-th loss: 0, or a random non-zero rank (the same draw on
    every rank)."""
    if who == "zero" or world_size == 1:
        return 0
    return random.Random(f"{seed}-{kill}").randrange(1, world_size)


def _log(out: Path, row: dict[str, Any]) -> None:
    with (out / "rank0.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")


def _train(config: dict[str, Any]) -> None:
    import torch

    ctx = torchjob.train.get_context()
    rank, gen, ws = ctx.get_world_rank(), ctx.get_generation(), ctx.get_world_size()
    out = Path(config["out"])
    if rank == 0:
        _log(out, {"ev": "enter", "gen": gen, "t": time.time()})
    torch.manual_seed(0)
    h = config["hidden"]
    model = torch.nn.Sequential(
        torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU()
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 0}
    restored = torchjob.train.register_state(state)
    if rank == 0:
        _log(out, {"ev": "restored", "gen": gen, "t": time.time(), "memory": restored})
    ddp = prepare_model(model)
    if config["in_place"]:
        # The DDP model is registered too (its state is the module's), so that its
        # all-reduce goes through the in-place hook; loading it again costs nothing here.
        state["model"] = ddp
        torchjob.train.register_state(state, in_place=True)
    if rank == 0:
        _log(out, {"ev": "model", "gen": gen, "t": time.time()})
    x = torch.randn(16, h)
    kills: list[int] = config["kills"]
    took: list[float] = []
    while state["step"] < config["steps"]:
        ctx = torchjob.train.get_context()
        if ctx.get_generation() != gen:  # re-formed in place inside the last report
            rank, gen, ws = ctx.get_world_rank(), ctx.get_generation(), ctx.get_world_size()
            if rank == 0:  # the function went on: its start, restore and DDP are this moment
                now = time.time()
                for ev in ("enter", "restored", "model"):
                    _log(out, {"ev": ev, "gen": gen, "t": now, "memory": True})
        t0 = time.time()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        state["step"] += 1
        step = state["step"]
        torchjob.train.report({"step": step})
        if torchjob.train.get_context().get_generation() != gen:
            continue  # this step was rolled back with the group's re-formation
        took.append(time.time() - t0)
        if rank == 0:
            _log(out, {"ev": "step", "gen": gen, "step": step, "t0": t0, "t1": time.time()})
        if step in kills:
            i = kills.index(step)
            if rank == victim(i, ws, config["who"], config["seed"]):
                _arm(out, i, gen, ws, statistics.median(took), config["seed"])


def _arm(out: Path, i: int, gen: int, ws: int, step_s: float, seed: int) -> None:
    """The victim of loss ``i``: SIGKILL this process at a random moment of its next step
    (``moment`` x its median step after now: in the compute, the gradients' all-reduce or the
    report's collective), once (a step redone after the restore does not kill again)."""
    marker = out / f"kill-{i}"
    if marker.exists():
        return
    moment = random.Random(f"{seed}-{i}-moment").random()

    def fire() -> None:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(
            fd, json.dumps({"t": time.time(), "gen": gen, "ws": ws, "moment": moment}).encode()
        )
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    timer = threading.Timer(moment * step_s, fire)
    timer.daemon = True
    timer.start()


# ------------------------------------------------------------------------------ the driver


class Probe:
    """Timestamps of the driver's recovery steps (this process runs ``fit``'s controller)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []
        self.start_methods: set[str] = set()

    def mark(self, name: str) -> None:
        self.marks.append((name, time.time()))

    @contextmanager
    def installed(self) -> Iterator[Probe]:
        probe = self
        wait, heal, reform = Execution.wait, WorkerGroup.heal, WorkerGroup.reform

        def timed_wait(self: Execution[Any], **kw: Any) -> Any:
            try:
                return wait(self, **kw)
            except LaunchError:
                probe.mark("detected")
                raise

        def timed_heal(self: WorkerGroup, n: int) -> None:
            probe.mark("heal0")
            try:
                heal(self, n)
            finally:
                probe.mark("heal1")
                if self.start_method:
                    probe.start_methods.add(self.start_method)

        def timed_reform(self: WorkerGroup, *a: Any, **kw: Any) -> None:
            probe.mark("reform0")
            try:
                reform(self, *a, **kw)
            finally:
                probe.mark("reform1")

        with (
            mock.patch.object(Execution, "wait", timed_wait),
            mock.patch.object(WorkerGroup, "heal", timed_heal),
            mock.patch.object(WorkerGroup, "reform", timed_reform),
        ):
            yield self

    def after(self, name: str, t: float, before: float = float("inf")) -> float | None:
        return next((m for n, m in self.marks if n == name and t <= m <= before), None)


def run(
    args: argparse.Namespace, size: int, how: str, who: str, n: int
) -> tuple[list[Loss], float]:
    """One ``fit`` of ``size`` workers with ``n`` losses."""
    out = Path(tempfile.mkdtemp(prefix=f"recovery-{size}-{how}-{who}-"))
    kills = [args.warmup + args.gap * i for i in range(n)]
    config = {
        "hidden": args.hidden,
        "in_place": args.in_place,
        "steps": kills[-1] + args.gap,
        "kills": kills,
        "who": who,
        "seed": args.seed + size,
        "out": str(out),
    }
    trainer = TorchTrainer(
        _train,
        train_loop_config=config,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(
            num_workers=(size - n, size) if how == "shrink" else size,
            elastic_grow_cooldown_s=3600,
        ),
        run_config=RunConfig(
            name=f"recovery-{size}-{how}-{who}",
            storage_path=str(out / "runs"),
            failure_config=FailureConfig(max_failures=n),
            progress=False,
        ),
    )
    probe = Probe()
    with probe.installed():
        try:
            trainer.fit()
        except Exception as e:  # a failed run: its losses are listed, not recovered
            print(f"run {out.name} failed: {type(e).__name__}: {e}", flush=True)
    losses, step_s = analyse(out, probe, n)
    args.start_methods |= probe.start_methods
    return losses, step_s


def measure(args: argparse.Namespace, size: int, how: str, who: str) -> tuple[list[Loss], float]:
    """``--losses`` losses at ``size`` ranks: one run, or (shrinking a small group, which
    cannot lose that many ranks and keep one) several."""
    losses: list[Loss] = []
    steps: list[float] = []
    while len(losses) < args.losses:
        n = args.losses - len(losses)
        if how == "shrink":
            n = min(n, size - 1)
        got, step_s = run(args, size, how, who, n)
        if not got:
            break
        losses += got
        if step_s == step_s:
            steps.append(step_s)
    return losses, statistics.median(steps) if steps else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="2,8,32,64", help="world sizes, comma-separated")
    p.add_argument("--losses", type=int, default=5, help="losses per (size, mode, victim)")
    p.add_argument("--modes", default="replace,shrink")
    p.add_argument("--victims", default="nonzero,zero", help="nonzero: a random rank > 0")
    p.add_argument("--hidden", type=int, default=32, help="the MLP's width")
    p.add_argument("--warmup", type=int, default=5, help="steps before the first loss")
    p.add_argument("--gap", type=int, default=4, help="steps between losses")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--in-place", action="store_true",
                   help="register_state(in_place=True): a shrink's survivors go on inside the "
                   "training function (recovery.in_place)")  # fmt: skip
    p.add_argument("--mib-per-rank", type=float, default=160.0,
                   help="memory a rank needs (skip a size that does not fit MemAvailable)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "scale")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.modes = args.modes.split(",")
    args.victims = args.victims.split(",")
    for m in args.modes:
        if m not in ("replace", "shrink"):
            p.error(f"--modes: unknown mode {m!r} (replace, shrink)")
    for v in args.victims:
        if v not in ("nonzero", "zero"):
            p.error(f"--victims: unknown victim {v!r} (nonzero, zero)")
    if any(s < 2 for s in args.sizes):
        p.error("--sizes: a recovery needs at least 2 ranks")
    args.start_methods = set()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    print(
        f"recovery after a SIGKILLed rank vs world size: local gloo workers on {os.cpu_count()} "
        f"CPU(s), OMP_NUM_THREADS=1, an MLP 2x{args.hidden} (tiny: the coordination cost, not "
        f"the state's size), register_state, a report every step, {args.losses} losses per row, "
        "the survivors' processes kept, resuming from their memory; "
        + (
            "in place: a shrink's survivors go on inside the training function"
            if args.in_place
            else "the training function run again in each generation"
        ),
        flush=True,
    )
    head = (
        f"{'ranks':>5} {'how':<8} {'victim':<7}{'n/fail':>6}{'p50':>8}{'p95':>8}{'lost':>5}{'step':>8}"
        + "".join(f"{p:>12}" for p in PHASES)
    )
    print(head + "\n" + "-" * len(head), flush=True)
    curve: dict[tuple[str, int], list[float]] = {}
    for size in args.sizes:
        need = size * args.mib_per_rank / 1024 + 1.0
        if (free := mem_available_gib()) < need:
            print(f"{size:>5} skipped: {free:.1f} GiB available, {need:.1f} GiB needed", flush=True)
            continue
        for how in args.modes:
            for who in args.victims:
                losses, step_s = measure(args, size, how, who)
                curve.setdefault((how, size), []).extend(
                    x.recovery for x in losses if x.recovery is not None
                )
                print(row_line(size, how, who, losses, step_s), flush=True)
                print(each_line(losses), flush=True)
    print(
        "recovery: the kill (at a random moment of the victim's step) to the end of the next "
        "generation's first step, no step subtracted; n/failed: losses / failed "
        "re-formations (not recovered, a second re-formation, or resumed from storage), the "
        "percentiles over the recovered; phases: medians of the recovered (see the module "
        "docstring); lost: steps redone, in total; "
        f"workers started by {'/'.join(sorted(args.start_methods)) or 'fork'}"
    )
    if curve:
        print(f"curve: {write_curve(args.out, curve)}")
    for (how, size), recs in sorted(curve.items()):
        if recs and pct(recs, 0.5) > TARGET_S:
            print(
                f"target missed: {how} at {size} ranks, p50 {pct(recs, 0.5):.2f}s > {TARGET_S:g}s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
