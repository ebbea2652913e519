"""``PyTorchTrainable``: a :class:`torchjob.sgd.PyTorchTrainer` as a Tune trainable (seeds 000/002).

The trial's config carries the trainer's arguments, with the hyperparameters
the creators read under ``"config"``, as in RaySGD::

    tune.Tuner(
        PyTorchTrainable,
        param_space={
            "model_creator": model_creator, "data_creator": data_creator,
            "optimizer_creator": optimizer_creator, "loss_creator": nn.MSELoss,
            "num_replicas": 2, "config": {"lr": tune.loguniform(1e-4, 1e-1)},
        },
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", num_samples=4),
        run_config=tune.RunConfig(stop={"training_iteration": 3}),
    )

Each step is one ``train()`` pass followed by ``validate()`` when the data
creator returns validation data; the step's metrics are both stats merged.
"""

from __future__ import annotations

from typing import Any

from torchjob.sgd.trainer import PyTorchTrainer
from torchjob.tune.trainables import Trainable


class PyTorchTrainable(Trainable):
    """One PyTorchTrainer per trial; ``step()`` = ``train()`` + ``validate()``."""

    trainer: PyTorchTrainer

    def setup(self, config: dict[str, Any]) -> None:
        kwargs = dict(config)
        self.validate_each_step = bool(kwargs.pop("validate", True))
        self.trainer = PyTorchTrainer(**kwargs)

    def step(self) -> dict[str, Any]:
        stats = self.trainer.train()
        if self.validate_each_step:
            try:
                stats.update(self.trainer.validate())
            except Exception as e:  # no validation data: train stats only, from now on
                if "no validation data" not in str(e):
                    raise
                self.validate_each_step = False
        return stats

    def cleanup(self) -> None:
        self.trainer.shutdown()
