"""Pure parts of the creator API: stats aggregation, Apex-to-torch.amp mapping, signature styles."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.sgd.creators import config_last
from torchjob.sgd.trainer import SGDConfigError, aggregate_stats, grad_scaler_args


def test_aggregate_weights_by_samples_and_sums_counts() -> None:
    stats = aggregate_stats(
        [
            {"val_loss": 1.0, "val_accuracy": 1.0, "num_samples": 30, "batch_count": 3, "epoch": 2},
            {"val_loss": 3.0, "val_accuracy": 0.0, "num_samples": 10, "batch_count": 1, "epoch": 2},
        ]
    )
    assert stats == {
        "val_loss": 1.5,
        "val_accuracy": 0.75,
        "num_samples": 40,
        "batch_count": 4,
        "epoch": 2,
    }


def test_aggregate_without_samples_averages_and_keeps_rank0_objects() -> None:
    stats = aggregate_stats([{"loss_g": 1.0, "tag": "r0"}, {"loss_g": 2.0, "tag": "r1"}])
    assert stats == {"loss_g": 1.5, "tag": "r0"}


@pytest.mark.parametrize(
    ("apex_args", "expected"),
    [
        pytest.param({"opt_level": "O1", "verbosity": 0, "num_losses": 2}, {}, id="o1"),
        pytest.param({"opt_level": "O2", "loss_scale": "dynamic"}, {}, id="o2-dynamic"),
        pytest.param({"loss_scale": 128}, {"init_scale": 128.0}, id="static-scale"),
    ],
)
def test_apex_args_that_map_onto_torch_amp(
    apex_args: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert grad_scaler_args(True, apex_args) == expected


@pytest.mark.parametrize(
    ("apex_args", "message"),
    [
        pytest.param({"opt_level": "O3"}, "O3", id="o3"),
        pytest.param({"opt_level": "O0"}, "use_fp16=False", id="o0"),
        pytest.param({"keep_batchnorm_fp32": True}, "keep_batchnorm_fp32", id="unknown-key"),
        pytest.param({"loss_scale": "big"}, "loss_scale", id="bad-scale"),
    ],
)
def test_apex_args_without_an_equivalent_are_refused(
    apex_args: dict[str, Any], message: str
) -> None:
    with pytest.raises(SGDConfigError, match=message):
        grad_scaler_args(True, apex_args)


def test_signature_styles_of_custom_functions() -> None:
    def documented(config, model, train_iterator, criterion, optimizer, scheduler=None):  # type: ignore[no-untyped-def]
        return {}

    def older(models, dataloader, criterion, optimizers, config):  # type: ignore[no-untyped-def]
        return {}

    assert not config_last(documented)
    assert config_last(older)
