"""An NCCL group that lost a peer re-forms in its survivors (issue 26, item 4): UNVERIFIED until
this runs on a machine with GPUs; ``TORCHJOB_NCCL_REFORM=1`` turns the path on
(``torchjob.launch.nccl``).

* one GPU: a rank aborts its communicator (``_abort_process_group``), forms a new one on the
  next generation's store in the same process, and its model stays on the device (the same
  storage, the same CUDA context) and trains on;
* two GPUs or more: rank 1 is SIGKILLed inside a collective; the driver tells the survivors to
  abort (the generation's store), they leave, the group heals (a new process takes rank 1's
  slot and GPU) and re-forms in place; the survivor's parameters are the same device tensors
  as before, and an all-reduce over the new group is right.

Skipped where ``torch.cuda.is_available()`` is False (CI, laptops). On a GPU machine:

    TORCHJOB_NCCL_REFORM=1 python -m pytest tests/gpu/test_nccl_reform.py -m gpu -v
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch
from tests.gpu_marks import NEEDS_GPU

from torchjob.launch import Placement, WorkerDiedError, WorkerGroup, worker_state

pytestmark = NEEDS_GPU


@pytest.fixture(autouse=True)
def _nccl_reform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHJOB_NCCL_REFORM", "1")


def _place_model() -> dict[str, Any]:
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device())
    model = torch.nn.Linear(64, 64).to(device)
    worker_state()["model"] = model
    return {
        "rank": dist.get_rank(),
        "device": str(device),
        "ptr": model.weight.data_ptr(),
    }


def _still_there_and_reduce() -> dict[str, Any]:
    import torch.distributed as dist

    model = worker_state().get("model")
    t = torch.ones(4, device=torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(t)
    return {
        "rank": dist.get_rank(),
        "kept": model is not None,
        "ptr": model.weight.data_ptr() if model is not None else None,
        "device": str(model.weight.device) if model is not None else None,
        "sum": t.tolist(),
    }


def _abort_here() -> None:
    from torchjob.launch import nccl

    nccl.abort_group()


def test_one_rank_aborts_its_communicator_and_forms_a_new_one_keeping_the_model_on_device() -> None:
    with WorkerGroup(1, backend="nccl", use_gpu=True, timeout_s=60) as g:
        before = g.execute(_place_model)[0]
        g.execute(_abort_here)
        g.reform(Placement.local(1, generation=1))
        after = g.execute(_still_there_and_reduce)[0]
    assert after["kept"] and after["ptr"] == before["ptr"] and after["device"] == before["device"]
    assert after["sum"] == [1.0] * 4


def _train_until_killed(victim: int) -> None:
    import torch.distributed as dist

    t = torch.ones(1 << 20, device=torch.device("cuda", torch.cuda.current_device()))
    for i in range(10_000):
        dist.all_reduce(t)
        torch.cuda.synchronize()
        if i == 20 and dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (one NCCL rank per GPU)")
def test_survivors_of_a_killed_nccl_rank_re_form_in_place_with_their_model_on_device() -> None:
    n = min(torch.cuda.device_count(), 4)
    with WorkerGroup(n, backend="nccl", use_gpu=True, timeout_s=120) as g:
        before = {r["rank"]: r for r in g.execute(_place_model)}
        with pytest.raises(WorkerDiedError):
            g.submit(_train_until_killed, (1,)).wait(loss_grace_s=60)
        assert g.survivable(), "the survivors answered (aborted) instead of hanging"
        g.heal(n)
        g.reform(Placement.local(n, generation=1))
        after = {r["rank"]: r for r in g.execute(_still_there_and_reduce)}
    assert after[1]["kept"] is False  # the replacement holds nothing yet
    for rank in (r for r in range(n) if r != 1):
        assert after[rank]["kept"] and after[rank]["ptr"] == before[rank]["ptr"]
        assert after[rank]["device"] == before[rank]["device"]
    assert all(a["sum"] == [float(n)] * 4 for a in after.values())
