"""The training script of the real-node hard-loss tests: the loop docs/runtime.md gives for a
hard loss (``register_state``, a report every step, a storage checkpoint every CKPT_EVERY
steps as the fallback).

    python tests/e2e/hard_loss_job.py EVENTS STEPS STEP_SECONDS CKPT_EVERY

Appends one JSON line per event to EVENTS (a file on the storage the pods share), each with
the pod, the pid, the rank, the world size and the generation (HARD_LOSS_HOLD_UNTIL_GENERATION=N: after the last
step, keep reporting until the job runs generation N; HARD_LOSS_GATE_DIR=D: a pod created for
a later generation than 0, a replacement, waits before it starts until D/open exists, so that
a test can set up a fault in it first; HARD_LOSS_BREAK_AT=N: in generation 0, after step N,
rank 1 shuts down its connections to the group, every process living on; HARD_LOSS_IN_PLACE=1:
``register_state(state, in_place=True)``, the loop going on in place across re-formations):
``restored`` (where the state came from: ``start``, ``memory`` or ``storage``, and its step;
``in_place`` where the group re-formed under the loop), ``step`` (after each step's report:
the restore point holds it) and ``final`` (the parameters' checksum, every rank, at the end).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time

import torch

from torchjob.train import (
    Checkpoint,
    RunConfig,
    ScalingConfig,
    get_checkpoint,
    get_context,
    register_state,
    report,
)
from torchjob.train.torch import TorchTrainer, prepare_model

EVENTS = sys.argv[1]


def emit(ev: str, **fields: object) -> None:
    ctx = get_context()
    line = {
        "ev": ev,
        "t": time.time(),
        "pod": socket.gethostname(),
        "pid": os.getpid(),
        "rank": ctx.get_world_rank(),
        "world": ctx.get_world_size(),
        "gen": ctx.get_generation(),
        **fields,
    }
    with open(EVENTS, "a") as f:  # O_APPEND: one short line per write
        f.write(json.dumps(line) + "\n")


def break_connections() -> int:
    """Shut down this process's TCP connections but the store's and the API server's: the
    group's (gloo's pairs). Every rank's next collective fails for a closed connection while
    every process lives on, as all 8 ranks of generation 19 did in bench/results/2026-12-03a.
    Returns how many were shut down."""
    keep_ports = {int(os.environ.get("MASTER_PORT", "0"))}
    # The API server's, and the driver's (a loopback connection, if any): never the group's.
    keep_hosts = {os.environ.get("KUBERNETES_SERVICE_HOST", ""), "127.0.0.1", "::1"}
    done = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            local, peer = s.getsockname(), s.getpeername()  # a listener has no peer: raises
            if {local[1], peer[1]} & keep_ports or peer[0] in keep_hosts:
                continue
            s.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            continue
        finally:
            s.close()  # the duplicate only; the shutdown is of the connection itself
    return done


def train_func(config: dict[str, float]) -> None:
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state: dict[str, object] = {"model": model, "opt": opt, "step": 0}
    source = "start"
    if register_state(state, in_place=os.environ.get("HARD_LOSS_IN_PLACE") == "1"):
        source = "memory"
    elif (ckpt := get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            saved = torch.load(os.path.join(d, "state.pt"))
        getattr(model, "module", model).load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state["step"] = saved["step"]
        source = "storage"
    emit("restored", step=state["step"], source=source)
    ctx = get_context()
    hold = int(os.environ.get("HARD_LOSS_HOLD_UNTIL_GENERATION", "0"))
    while True:
        if get_context().get_generation() != ctx.get_generation():
            # Re-formed in place inside the last report: the state (and its step) may have
            # been rolled back under the loop, and the ranks renumbered.
            ctx = get_context()
            emit("restored", step=state["step"], source="memory", in_place=True)
        step, rank = int(state["step"]), ctx.get_world_rank()  # type: ignore[call-overload]
        if step >= config["steps"] and ctx.get_generation() >= hold:
            break
        if step >= config["steps"]:  # hold (reporting) until the job runs generation ``hold``
            time.sleep(0.2)
            report({"step": step})
            continue
        time.sleep(config["step_seconds"])
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        state["step"] = step
        if step % int(config["ckpt_every"]) == 0 and rank == 0:  # the storage fallback
            with tempfile.TemporaryDirectory() as d:
                saved = {
                    "model": getattr(model, "module", model).state_dict(),
                    "opt": opt.state_dict(),
                    "step": step,
                }
                torch.save(saved, os.path.join(d, "state.pt"))
                report({"step": step}, checkpoint=Checkpoint.from_directory(d))
        else:
            report({"step": step})  # the restore point: this step, in every rank's memory
        emit("step", step=step)
        breaks = step == int(os.environ.get("HARD_LOSS_BREAK_AT", "-1")) and rank == 1
        if breaks and ctx.get_generation() == 0:
            emit("broke", step=step, connections=break_connections())
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    emit("final", step=step, params=[float(v) for v in params])


def wait_at_the_gate() -> None:
    """HARD_LOSS_GATE_DIR: a replacement waits here, before its runtime starts (so it is not
    Ready, and no generation names it), until the test opens the gate."""
    gate = os.environ.get("HARD_LOSS_GATE_DIR")
    if gate and int(os.environ.get("TORCHJOB_GENERATION", "0")) > 0:
        while not os.path.exists(os.path.join(gate, "open")):
            time.sleep(0.1)


if __name__ == "__main__":
    wait_at_the_gate()
    steps, step_seconds, ckpt_every = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    TorchTrainer(
        train_func,
        train_loop_config={"steps": steps, "step_seconds": step_seconds, "ckpt_every": ckpt_every},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="hardloss"),
    ).fit()
