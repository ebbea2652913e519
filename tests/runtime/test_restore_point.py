"""A hard loss costs a step, not the work since the last checkpoint (issue 26, item 2).

Real gloo workers on this machine. The training function registers its state
(``torchjob.train.register_state``) and reports every step without any storage
checkpoint: a rank SIGKILLed mid-run (or SIGSTOPped: a silent peer, found by the
heartbeat watchdog) is replaced in place and the group resumes from the survivors'
memory. When every worker process is lost at once and the driver lives (on a laptop; in a
pod, a formation the driver gives up), the new processes find the restore point their
predecessors left in shared memory (``torchjob.train.recovery.shm_keep``). The parameters afterwards are equal on every rank and equal, within 1e-5, to a
single-process run over the same batches (DDP averages the ranks' gradients; only the
order of the float sums differs, so the tolerance is a few float32 ulps over the steps).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import torchjob.train
from torchjob.train import FailureConfig, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, prepare_model

WORLD = 3
STEPS = 12
LOSE_AT = 5
"""The step after whose report world rank 1 is lost (in generation 0)."""
LR = 0.1


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def initial_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def loop(config: dict[str, Any]) -> None:
    ctx = torchjob.train.get_context()
    rank = ctx.get_world_rank()
    model = prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 0}
    from_memory = torchjob.train.register_state(state)
    memory = ctx.get_generation() > 0 and config["memory"]
    assert from_memory == memory, "only the re-formed group restores"
    assert torchjob.train.get_checkpoint() is None  # nothing committed, nothing read
    log = Path(config["dir"]) / f"gen{ctx.get_generation()}-rank{rank}.json"
    log.write_text(json.dumps({"first_step": state["step"] + 1, "restored": from_memory}))
    while state["step"] < STEPS:
        step = state["step"] + 1
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        state["step"] = step
        torchjob.train.report({"step": step})
        if ctx.get_generation() == 0 and step == LOSE_AT and rank in config["victims"]:
            os.kill(os.getpid(), config["signal"])
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    (Path(config["dir"]) / f"final-rank{rank}.pt").write_bytes(_dump(params))


def _dump(t: torch.Tensor) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def reference() -> torch.Tensor:
    """The uninterrupted run: the same batches, the ranks' gradients averaged."""
    model = initial_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        grads = []
        for rank in range(WORLD):
            model.zero_grad()
            x, y = batch(step, rank)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = torch.stack([g[i] for g in grads]).mean(0)
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize(
    ("sig", "silent_s", "every", "victims", "resumes_at"),
    [
        pytest.param(signal.SIGKILL, None, None, [1], LOSE_AT + 1, id="sigkill"),
        pytest.param(signal.SIGSTOP, "3", None, [1], LOSE_AT + 1, id="silent-peer"),
        # A restore point every 3 reports (TORCHJOB_RESTORE_POINT_EVERY, as the cadence
        # chooses for a large state): reports 1, 4, 7, ...; lost after report 5, the group
        # goes back to report 4's state and redoes step 5, with the same result.
        pytest.param(signal.SIGKILL, None, "3", [1], LOSE_AT, id="sigkill-every-3"),
        # No survivor: the restore point is what the lost processes left in /dev/shm.
        pytest.param(signal.SIGKILL, None, None, [0, 1, 2], LOSE_AT + 1, id="every-rank"),
        # ... and without it (TORCHJOB_RESTORE_POINT_SHM=0) nothing holds one: from the start.
        pytest.param(signal.SIGKILL, None, None, [0, 1, 2], 1, id="every-rank-no-shm"),
    ],
)
def test_a_lost_rank_resumes_from_the_survivors_memory(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sig: int,
    silent_s: str | None,
    every: str | None,
    victims: list[int],
    resumes_at: int,
) -> None:
    if silent_s is not None:
        # The watchdog's threshold; the collective timeout (60 s) would be the only way out
        # without it.
        monkeypatch.setenv("TORCHJOB_SILENT_PEER_S", silent_s)
    if every is not None:
        monkeypatch.setenv("TORCHJOB_RESTORE_POINT_EVERY", every)
    memory = resumes_at > 1
    if not memory:
        monkeypatch.setenv("TORCHJOB_RESTORE_POINT_SHM", "0")
    trainer = TorchTrainer(
        loop,
        train_loop_config={
            "dir": str(tmp_path),
            "signal": int(sig),
            "victims": victims,
            "memory": memory,
        },
        scaling_config=ScalingConfig(num_workers=WORLD),
        run_config=RunConfig(
            name="mem",
            storage_path=str(tmp_path / "runs"),
            failure_config=FailureConfig(max_failures=1),
        ),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    )
    result = trainer.fit()
    assert result.error is None
    steps = [m["step"] for m in result.metrics_history]
    assert steps[-1] == STEPS
    after = [json.loads((tmp_path / f"gen1-rank{r}.json").read_text()) for r in range(WORLD)]
    # Every rank of the re-formed group, the replacement included, restored from memory
    # and went on from the step after the last restore point (the last report, unless a
    # cadence was set): at most the unfinished step is lost.
    assert all(a["restored"] == memory for a in after)
    assert {a["first_step"] for a in after} == {resumes_at}
    finals = [torch.load(tmp_path / f"final-rank{r}.pt") for r in range(WORLD)]
    for f in finals[1:]:
        assert torch.equal(f, finals[0])
    torch.testing.assert_close(finals[0], reference(), rtol=1e-5, atol=1e-5)
