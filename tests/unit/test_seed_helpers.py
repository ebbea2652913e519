"""Seed 000's creator convention, the exact validation sampler, is_primary(), the run help."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchjob import contract
from torchjob.sgd import creators, data, runner
from torchjob.train import is_primary


def test_optimizer_creator_may_return_criterion_and_optimizer() -> None:
    model = nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.MSELoss()
    assert creators.split_optimizer_creator_result((loss, opt), None) == (loss, opt)
    assert creators.split_optimizer_creator_result(opt, None) == (None, opt)
    two = (opt, torch.optim.SGD(model.parameters(), lr=0.2))
    assert creators.split_optimizer_creator_result(two, None) == (None, two)
    with pytest.raises(ValueError, match="loss_creator= is given too"):
        creators.split_optimizer_creator_result((loss, opt), nn.MSELoss)
    with pytest.raises(ValueError, match=r"non-optimizers at \['0: Linear', '1: Linear'\]"):
        creators.split_optimizer_creator_result((model, model), None)


def _spec(**kw: object) -> runner.RunnerSpec:
    base: dict[str, object] = dict(
        model_creator=lambda c: nn.Linear(1, 1),
        data_creator=lambda c: torch.utils.data.TensorDataset(torch.ones(4, 1), torch.ones(4, 1)),
        optimizer_creator=lambda m, c: torch.optim.SGD(m.parameters(), lr=0.1),
        loss_creator=None,
        scheduler_creator=None,
        train_function=None,
        validation_function=None,
        config={},
        batch_size_per_worker=2,
        use_fp16=False,
        scheduler_step_freq="batch",
        grad_scaler_args={},
    )
    base.update(kw)
    return runner.RunnerSpec(**base)  # type: ignore[arg-type]


def test_a_replica_without_any_loss_fails_when_built() -> None:
    with pytest.raises(ValueError, match=r"no loss: .* Pass loss_creator="):
        runner.Runner(_spec())
    built = runner.Runner(_spec(train_function=lambda *a: {}))  # custom train, no validation data
    assert built.criterion is None


@pytest.mark.parametrize(("size", "world"), [(397, 2), (5, 3), (1, 2), (0, 2)])
def test_shard_sampler_covers_each_sample_exactly_once(size: int, world: int) -> None:
    shards = [list(data.ShardSampler(range(size), world, r)) for r in range(world)]
    assert sorted(i for s in shards for i in s) == list(range(size))
    assert [len(data.ShardSampler(range(size), world, r)) for r in range(world)] == [
        len(s) for s in shards
    ]


def test_is_primary_outside_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchjob.train import _session

    monkeypatch.setattr(_session, "_FIT_LED", [None])  # no fit() ran in this process
    monkeypatch.delenv(contract.JOB_NAME, raising=False)
    assert is_primary()
    from torchjob.contract import PodEnv

    for index, expected in ((0, True), (1, False)):
        pod = PodEnv(
            job_name="j", namespace="ns", pod_index=index, replicas=2, nproc_per_node=1,
            generation=0, rdzv_host="h", rdzv_port=1, backend="gloo",
        )  # fmt: skip
        for key, value in pod.to_env().items():
            monkeypatch.setenv(key, value)
        assert is_primary() is expected


def test_run_help_states_the_real_max_restarts_default() -> None:
    from torchjob.api.models import FailurePolicy
    from torchjob.cli.main import build_parser

    parser = build_parser()
    run = next(
        a.choices["run"]
        for a in parser._actions
        if getattr(a, "choices", None) and "run" in a.choices
    )
    text = " ".join(run.format_help().split())
    assert (
        f"defaults to {FailurePolicy().max_restarts} when the manifest has no failurePolicy" in text
    )
    assert "else 0" not in text


def test_is_primary_after_fit_follows_where_rank_0_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod 1 led the last generation (status.members [1, 0]): after its fit() it is the
    primary, and pod 0 is not, whatever their indices say."""
    from torchjob.contract import PodEnv
    from torchjob.train import _session

    pod = PodEnv(
        job_name="j", namespace="ns", pod_index=0, replicas=2, nproc_per_node=1,
        generation=2, rdzv_host="h", rdzv_port=1, backend="gloo",
    )  # fmt: skip
    for key, value in pod.to_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(_session, "_FIT_LED", [None])
    assert is_primary(), "before any fit: pod 0"
    _session.set_fit_led(False)
    assert not is_primary()
    _session.set_fit_led(True)
    assert is_primary()
