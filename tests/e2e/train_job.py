"""The training script the e2e TorchJob runs in its pods (through the process kubelet).

An unchanged TorchTrainer script: in a pod, ``fit()`` reads the env contract the
operator wrote and runs this pod's share of the workers. In generation 0, rank 1
crashes at epoch ``CRASH_AT``; the operator restarts the group and generation 1
resumes from the latest checkpoint rank 0 committed.

    python tests/e2e/train_job.py EPOCHS CRASH_AT [EPOCH_SECONDS]

CRASH_AT -1 never crashes; EPOCH_SECONDS slows each epoch down (a test can then
preempt a pod mid-run). With TORCHJOB_E2E_CRASH=raise, rank 1 raises instead of exiting.
With TORCHJOB_E2E_HOLD_UNTIL_GENERATION=N the last epoch waits (reporting) until the job
runs generation N, so a test's membership changes happen before training ends;
TORCHJOB_E2E_HOLD_AT=E:G holds epoch E the same way until generation G.
With TORCHJOB_E2E_TORN_AT=K, rank 0 of generation 0, after epoch K's report (its checkpoint
commits in the background), starts saving checkpoint TORN_INDEX itself (a state that says
epoch TORN_EPOCH) and stops after the files and the manifest, before the commit marker: it
waits there until its pod is killed, a rank 0 lost in the middle of an upload.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time

import torch

from torchjob import contract
from torchjob.checkpoint import CheckpointStorage
from torchjob.train import (
    Checkpoint,
    RunConfig,
    ScalingConfig,
    get_checkpoint,
    get_context,
    get_preemption_info,
    report,
)
from torchjob.train.torch import TorchTrainer, prepare_model

TORN_INDEX = 900
TORN_EPOCH = 999


def _save_torn(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Checkpoint TORN_INDEX uploaded up to its manifest; this process never writes its marker."""

    def lost() -> None:
        print(f"rank 0 uploaded checkpoint {TORN_INDEX} without its marker; waiting", flush=True)
        while True:
            time.sleep(60)

    storage = CheckpointStorage(os.environ[contract.CHECKPOINT_PATH])
    with tempfile.TemporaryDirectory() as d:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": TORN_EPOCH}
        torch.save(state, os.path.join(d, "state.pt"))
        storage.commit(d, metrics={"epoch": TORN_EPOCH}, index=TORN_INDEX, verify=lost)


def train_func(config: dict) -> None:
    ctx = get_context()
    print(
        f"rank {ctx.get_world_rank()} of {ctx.get_world_size()} on {socket.gethostname()},"
        f" group via {os.environ.get('MASTER_ADDR')}",
        flush=True,
    )
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + ctx.get_world_rank())
    x = torch.randn(64, 4, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    start = 0
    ckpt = get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        getattr(model, "module", model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
        print(
            f"resumed from epoch {state['epoch']} at generation {os.environ['TORCHJOB_GENERATION']}",
            flush=True,
        )
    # Epoch -> the generation it waits for: the last epoch's (TORCHJOB_E2E_HOLD_UNTIL_GENERATION),
    # and TORCHJOB_E2E_HOLD_AT="E:G", epoch E waits until generation G (a test that must act
    # while generation 0 trains, however fast this machine is).
    holds = {config["epochs"] - 1: int(os.environ.get("TORCHJOB_E2E_HOLD_UNTIL_GENERATION", "-1"))}
    if os.environ.get("TORCHJOB_E2E_HOLD_AT"):
        at, _, until = os.environ["TORCHJOB_E2E_HOLD_AT"].partition(":")
        holds[int(at)] = int(until)
    told: tuple[str, ...] | None = None
    for epoch in range(start, config["epochs"]):
        while int(os.environ["TORCHJOB_GENERATION"]) < holds.get(epoch, -1):
            # Reports let a membership change stop this generation; the next one resumes
            # from the previous epoch's checkpoint and trains the last epoch.
            time.sleep(config["epoch_seconds"] or 0.1)
            report({"epoch": epoch - 1, "holding": 1})
        if (
            os.environ.get("TORCHJOB_GENERATION") == "0"
            and epoch == config["crash_at"]
            and ctx.get_world_rank() == 1
        ):
            print(f"rank 1 crashing at epoch {epoch}", flush=True)
            if os.environ.get("TORCHJOB_E2E_CRASH") == "raise":
                raise RuntimeError(f"rank 1 raised at epoch {epoch}")
            os._exit(1)
        time.sleep(config["epoch_seconds"])
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if epoch == start:
            # What a test compares across a membership change: the process that trains this
            # generation, and the parameters every rank holds after its first step.
            params = torch.cat([p.detach().flatten() for p in model.parameters()])
            print(
                f"generation {os.environ['TORCHJOB_GENERATION']} rank {ctx.get_world_rank()}"
                f" pid {os.getpid()} params {[round(v, 6) for v in params.tolist()]}",
                flush=True,
            )
        # What the operator says is coming (every rank asks: it is a collective), told once.
        # Asked every epoch of every e2e job: through re-formations, joins and shrinks.
        notice = get_preemption_info()
        if notice is not None and notice.pods != told:
            told = notice.pods
            print(
                f"preemption notice: ranks {list(notice.ranks)} of pods {list(notice.pods)}"
                f" ({', '.join(notice.reasons)}) within {notice.seconds_left:.0f}s",
                flush=True,
            )
        metrics = {"epoch": epoch, "loss": loss.item()}
        if ctx.get_world_rank() == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save(
                    {
                        "model": getattr(model, "module", model).state_dict(),
                        "opt": opt.state_dict(),
                        "epoch": epoch,
                    },
                    os.path.join(d, "state.pt"),
                )
                report(metrics, checkpoint=Checkpoint.from_directory(d))
            if os.environ.get("TORCHJOB_GENERATION") == "0" and epoch == int(
                os.environ.get("TORCHJOB_E2E_TORN_AT", "-1")
            ):
                _save_torn(getattr(model, "module", model), opt)
        else:
            report(metrics)
    if ctx.get_world_rank() == 0:
        print(f"done: {config['epochs']} epochs, world size {ctx.get_world_size()}", flush=True)


if __name__ == "__main__":
    epochs, crash_at = int(sys.argv[1]), int(sys.argv[2])
    epoch_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    TorchTrainer(
        train_func,
        train_loop_config={"epochs": epochs, "crash_at": crash_at, "epoch_seconds": epoch_seconds},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="e2e"),
    ).fit()
