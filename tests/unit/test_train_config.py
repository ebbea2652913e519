"""Config validation names the field; torch stays out of the light imports."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from torchjob.train import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)


@pytest.mark.parametrize(
    ("factory", "kwargs", "field"),
    [
        pytest.param(ScalingConfig, {"num_workers": 0}, "num_workers", id="zero-workers"),
        pytest.param(ScalingConfig, {"num_workers": (3, 2)}, "num_workers", id="min-above-max"),
        pytest.param(CheckpointConfig, {"num_to_keep": 0}, "num_to_keep", id="keep-zero"),
        pytest.param(
            CheckpointConfig, {"checkpoint_score_order": "up"}, "checkpoint_score_order", id="order"
        ),
        pytest.param(FailureConfig, {"max_failures": -2}, "max_failures", id="failures"),
        pytest.param(TorchConfig, {"timeout_s": 0}, "timeout_s", id="timeout"),
        pytest.param(TorchConfig, {"backend": "mpi"}, "backend", id="backend"),
        pytest.param(RunConfig, {"name": "a/b"}, "name", id="name"),
        pytest.param(ScalingConfig, {"num_wrkers": 2}, "num_wrkers", id="typo"),
    ],
)
def test_errors_name_the_field(factory: Any, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        factory(**kwargs)


def test_elastic_bounds_and_budget() -> None:
    sc = ScalingConfig(num_workers=(2, 4))
    assert (sc.min_workers, sc.max_workers, sc.elastic) == (2, 4, True)
    assert ScalingConfig(num_workers=3).elastic is False
    assert FailureConfig(max_failures=-1).budget is None
    assert TorchConfig().backend == "auto"


def test_light_imports_do_not_load_torch() -> None:
    code = (
        "import sys, torchjob, torchjob.contract, torchjob.train, torchjob.checkpoint, "
        "torchjob.launch.policy; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
