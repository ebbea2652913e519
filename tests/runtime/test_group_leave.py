"""A rank that leaves a broken gloo group closes the group's connections even while something
still refers to the group (DDP's reducer, kept alive by the failed function's traceback or the
user's globals): otherwise ``destroy_process_group`` leaves gloo's pairs open and a survivor two
hops from the lost rank in the ring waits on it until the collective's timeout, so the group
cannot re-form in place (issue 26: at 8 ranks the watchdog killed such survivors after 30 s).
The pure parts of the NCCL path (``torchjob.launch.nccl``) are checked here too; the path itself
needs GPUs (tests/gpu/test_nccl_reform.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from tests.kube import wait_for

from torchjob.launch import WorkerDiedError, WorkerGroup, nccl
from torchjob.launch.settings import RuntimeSettings

_HELD: list[object] = []


def _all_reduce_until_killed(victim: int) -> None:
    import torch
    import torch.distributed as dist

    _HELD.append(dist.group.WORLD)  # as DDP's reducer refers to the group
    t = torch.ones(256)
    for i in range(100_000):
        dist.all_reduce(t)
        if i == 10 and dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGKILL)


def test_every_survivor_of_a_killed_rank_answers_while_the_group_is_still_referred_to() -> None:
    with WorkerGroup(5, backend="gloo") as g:
        with pytest.raises(WorkerDiedError):
            # Without the fix the ranks two hops away wait out this grace and the group
            # has no survivors to keep.
            g.submit(_all_reduce_until_killed, (4,)).wait(loss_grace_s=120)
        assert g.lost() == [4]
        assert g.survivable()


def test_nccl_re_forms_in_place_only_when_asked() -> None:
    off = RuntimeSettings.from_env({})
    assert nccl.in_place("gloo", off) and not nccl.in_place("nccl", off)
    assert nccl.in_place("nccl", RuntimeSettings.from_env({nccl.ENV_NCCL_REFORM: "1"}))
    assert nccl.worker_env(off) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    chosen = RuntimeSettings.from_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert nccl.worker_env(chosen) == {}  # the user's choice stands


def _wait_inside_c(entered: str) -> None:
    import threading

    open(entered, "w").close()
    threading.Event().wait()  # a lock acquired in C with the GIL released, as gloo's waits are


def test_a_kill_with_stacks_leaves_where_each_worker_waited_in_its_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    entered = [str(tmp_path / f"entered-{r}") for r in range(2)]
    with WorkerGroup(2, backend="gloo") as g:
        execution = g.submit(_dispatch_wait, (entered,))
        wait_for(lambda: all(os.path.exists(p) for p in entered), 60, "both workers inside")
        g.kill_with_stacks()
        with pytest.raises(WorkerDiedError) as died:
            execution.wait(loss_grace_s=10)
    assert died.value.signal == signal.SIGKILL
    err = capfd.readouterr().err
    assert err.count("most recent call first") >= 2  # every thread's stack, of both workers
    assert err.count("_wait_inside_c") == 2  # the frame each main thread waited in


def _dispatch_wait(entered: list[str]) -> None:
    import torch.distributed as dist

    _wait_inside_c(entered[dist.get_rank()])
