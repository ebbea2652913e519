"""When a worker is forked from the driver and when it starts as a fresh interpreter."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.launch._start import ENV_START, choose

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def _choose(env: dict[str, str] | None = None, **overrides: Any) -> tuple[str, str]:
    kwargs: dict[str, Any] = {
        "platform": "linux",
        "use_gpu": False,
        "backend": "gloo",
        "torch_imported": True,
        "cuda_initialized": False,
        "other_threads": 0,
    }
    kwargs.update(overrides)
    return choose(CPU_ENV if env is None else env, **kwargs)


def test_a_single_threaded_cpu_driver_on_linux_forks() -> None:
    assert _choose() == ("fork", "forked from the driver")


def test_a_driver_without_torch_forks_whatever_the_thread_count() -> None:
    # Nothing of OpenMP exists in the driver yet: the child imports torch with its own env.
    assert _choose({"CUDA_VISIBLE_DEVICES": ""}, torch_imported=False)[0] == "fork"


@pytest.mark.parametrize(
    ("env", "overrides", "why"),
    [
        ({**CPU_ENV, ENV_START: "spawn"}, {}, "TORCHJOB_WORKER_START=spawn"),
        (CPU_ENV, {"platform": "darwin"}, "only used on Linux, not darwin"),
        (CPU_ENV, {"use_gpu": True}, "CUDA state cannot be forked"),
        (CPU_ENV, {"backend": "nccl"}, "CUDA state cannot be forked"),
        ({"OMP_NUM_THREADS": "1"}, {}, "CUDA state cannot be forked"),
        (CPU_ENV, {"cuda_initialized": True}, "the driver initialized CUDA"),
        (CPU_ENV, {"other_threads": 2}, "runs 2 other thread(s)"),
        ({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "4"}, {}, "OMP_NUM_THREADS asks"),
        ({"CUDA_VISIBLE_DEVICES": ""}, {}, "OMP_NUM_THREADS asks"),
    ],
)
def test_what_keeps_a_worker_a_fresh_interpreter(
    env: dict[str, str], overrides: dict[str, Any], why: str
) -> None:
    method, reason = _choose(env, **overrides)
    assert method == "spawn"
    assert why in reason
