"""How a worker starts (``torchjob.launch._start.choose``): from the zygote, forked from the
driver, or as a fresh interpreter; and when the driver may be copied into a zygote
(``torchjob.launch.cuda_guard.copyable``)."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.launch._start import ENV_START, choose
from torchjob.launch.cuda_guard import copyable, libcuda_loaded

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
FORK = {**CPU_ENV, ENV_START: "fork"}


def _choose(env: dict[str, str] | None = None, **overrides: Any) -> tuple[str, str]:
    kwargs: dict[str, Any] = {
        "platform": "linux",
        "use_gpu": False,
        "backend": "gloo",
        "torch_imported": True,
        "cuda_touched": False,
        "other_threads": 0,
    }
    kwargs.update(overrides)
    return choose(CPU_ENV if env is None else env, **kwargs)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"use_gpu": True, "backend": "nccl"}, {"other_threads": 3}, {"cuda_touched": True}],
)
def test_on_linux_every_worker_comes_from_the_zygote(overrides: dict[str, Any]) -> None:
    # GPU workers, a threaded driver and one that touched CUDA included: the zygote never did.
    assert _choose(**overrides)[0] == "zygote"
    assert _choose({ENV_START: "zygote"}, **overrides)[0] == "zygote"


def test_spawn_is_asked_for_or_the_only_way_off_linux() -> None:
    assert _choose({ENV_START: "spawn"}) == ("spawn", "TORCHJOB_WORKER_START=spawn")
    assert _choose(platform="darwin") == ("spawn", "workers are only forked on Linux, not darwin")


def test_a_bad_setting_names_the_variable() -> None:
    with pytest.raises(ValueError, match="TORCHJOB_WORKER_START='forkserver' must be one of"):
        _choose({ENV_START: "forkserver"})


def test_fork_from_a_single_threaded_cpu_driver_on_linux() -> None:
    assert _choose(FORK) == ("fork", "forked from the driver")
    # Nothing of OpenMP exists in the driver yet: the child imports torch with its own env.
    assert _choose({ENV_START: "fork", "CUDA_VISIBLE_DEVICES": ""}, torch_imported=False)[0] == (
        "fork"
    )


@pytest.mark.parametrize(
    ("env", "overrides", "why"),
    [
        (FORK, {"use_gpu": True}, "CUDA state cannot be forked"),
        (FORK, {"backend": "nccl"}, "CUDA state cannot be forked"),
        ({ENV_START: "fork", "OMP_NUM_THREADS": "1"}, {}, "CUDA state cannot be forked"),
        (FORK, {"cuda_touched": True}, "the driver touched CUDA"),
        (FORK, {"other_threads": 2}, "runs 2 other thread(s)"),
        ({**FORK, "OMP_NUM_THREADS": "4"}, {}, "OMP_NUM_THREADS asks"),
        ({ENV_START: "fork", "CUDA_VISIBLE_DEVICES": ""}, {}, "OMP_NUM_THREADS asks"),
    ],
)
def test_what_keeps_a_forked_worker_a_fresh_interpreter(
    env: dict[str, str], overrides: dict[str, Any], why: str
) -> None:
    method, reason = _choose(env, **overrides)
    assert method == "spawn"
    assert why in reason


def test_the_driver_is_copied_into_the_zygote_only_when_single_threaded_and_cuda_free() -> None:
    assert copyable(platform="linux", touched=None, other_threads=0) is None
    assert "darwin" in str(copyable(platform="darwin", touched=None, other_threads=0))
    assert "1 other thread" in str(copyable(platform="linux", touched=None, other_threads=1))
    touched = copyable(platform="linux", touched="CUDA is initialized", other_threads=0)
    assert "touched CUDA (CUDA is initialized)" in str(touched)


def test_a_loaded_cuda_driver_counts_as_touched_whoever_loaded_it() -> None:
    maps = "7f00-7f10 r-xp 0 00:00 1 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n"
    assert libcuda_loaded(maps)
    assert not libcuda_loaded("7f00-7f10 r-xp 0 00:00 1 /venv/torch/lib/libtorch_cuda.so\n")
