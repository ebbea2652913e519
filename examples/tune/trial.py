"""One tuning trial as a TorchJob: an ordinary TorchTrainer script (see study.py).

In a trial's TorchJob (the operator makes one per trial of a TorchTune: study.py or
torchtune.yaml), ``TORCHJOB_TUNE_CONFIG`` holds the trial's config and ``TorchTrainer`` merges
it (here ``{"lr": ...}``) into ``train_loop_config``; run alone (``python trial.py``) it trains
with the defaults below. Rank 0's reports reach the TorchJob's ``status.progress``, where the
operator reads them and optuna's pruner judges them.

The model is a toy with a known optimum: one weight ``w`` fitted by SGD to 3.0, the loss
``(w - 3)^2`` after each epoch of ``steps`` SGD steps. A small ``lr`` converges slowly, so its
early losses are high: the trials a pruner stops.
"""

import os
import tempfile
import time

import torch

import torchjob.train
from torchjob.train import Checkpoint, RunConfig, ScalingConfig
from torchjob.train.torch import TorchTrainer, prepare_model


def train_func(config):
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    model = prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    one, target = torch.ones(1, 1), torch.full((1, 1), 3.0)
    for epoch in range(config["epochs"]):
        for _ in range(config["steps"]):
            loss = ((model(one) - target) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        time.sleep(config["epoch_seconds"])  # stands in for a real epoch's work
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            torchjob.train.report(
                {"loss": float(loss.item()), "epoch": epoch, "lr": config["lr"]},
                checkpoint=Checkpoint.from_directory(d),
            )


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.1, "epochs": 6, "steps": 10, "epoch_seconds": 0.5},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(progress=False),
    )
    result = trainer.fit()
    print(f"[trial] done: {result.metrics}, checkpoint {result.checkpoint}")
