"""torchjob.sgd: RaySGD's creator API (``PyTorchTrainer``) without Ray.

``PyTorchTrainer(model_creator, data_creator, optimizer_creator, loss_creator, ...)``
keeps one replica per local worker process (:class:`torchjob.launch.WorkerGroup`)
and trains it pass by pass with ``train()`` / ``validate()``; see docs/sgd.md.
``PyTorchTrainable`` plugs it into :class:`torchjob.tune.Tuner`.

Inside custom train functions, :func:`autocast`, :func:`backward` and
:func:`step` apply ``use_fp16`` (torch.amp) the way the default functions do.
"""

from torchjob.sgd.steps import autocast, backward, step, to_device
from torchjob.sgd.steps import train as default_train
from torchjob.sgd.steps import validate as default_validate
from torchjob.sgd.trainable import PyTorchTrainable
from torchjob.sgd.trainer import PyTorchTrainer, SGDConfigError, aggregate_stats

__all__ = [
    "PyTorchTrainable",
    "PyTorchTrainer",
    "SGDConfigError",
    "aggregate_stats",
    "autocast",
    "backward",
    "default_train",
    "default_validate",
    "step",
    "to_device",
]
