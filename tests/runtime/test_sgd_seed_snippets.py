"""Seed 002's PyTorchTrainer snippets, running on torchjob with only the imports changed.

Where the seed leaves names undefined (``Discriminator``, ``Generator``,
``weights_init``, ``inception_score``, the per-model ``train`` helper, the
creators shown by ``literalinclude``), this module defines small ones; the
datasets are synthetic, so nothing is downloaded. ``num_replicas=100,
use_gpu=True`` become 2 CPU replicas. Two edits to the seed's GAN body, both
forced by today's PyTorch rather than by torchjob: its parameters are named
after the variables the body uses (``models``, ``dataloader``, ``optimizers``;
same positions as the documented signature), and ``real_label = 1.0`` instead of
``1`` (``torch.full`` infers int64 from an int, which ``BCELoss`` rejects).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import TensorDataset

from torchjob.sgd import PyTorchTrainer
from torchjob.sgd import default_train as _default_train

pytestmark = pytest.mark.runtime

NUM_REPLICAS = 2


# --- the creators of the seed's "Setting up training" section ---------------------------
class LinearDataset(torch.utils.data.Dataset):
    def __init__(self, a: float, b: float, size: int = 256) -> None:
        x = torch.linspace(0, 1, size)
        self.x = x.unsqueeze(1)
        self.y = (a * x + b).unsqueeze(1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __len__(self) -> int:
        return len(self.x)


def model_creator(config):
    return nn.Linear(1, 1)


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))


def data_creator(config):
    return LinearDataset(2, 5), LinearDataset(2, 5, size=64)


def scheduler_creator(optimizer, config):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)


def test_putting_things_together_train_validate_save_restore_get_model() -> None:
    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        scheduler_creator=scheduler_creator,
        config={"lr": 0.001},
        num_replicas=NUM_REPLICAS,
        use_gpu=False,
    )
    trainer.train()
    stats = trainer.validate()
    assert stats["val_loss"] > 0
    assert "val_accuracy" not in stats  # regression: accuracy does not apply

    checkpoint_path = os.path.join(tempfile.mkdtemp(), "checkpoint")
    trainer_1 = trainer
    trainer_1.save(checkpoint_path)

    trainer_2 = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        num_replicas=NUM_REPLICAS,
    )
    trainer_2.restore(checkpoint_path)

    trainer.train()
    model = trainer.get_model()  # Returns multiple models if the model_creator does.
    assert isinstance(model, nn.Linear)
    restored = trainer_2.get_model()
    assert not torch.equal(restored.weight, model.weight)  # trainer_2 holds the saved state
    trainer_2.shutdown()
    trainer.shutdown()


def test_initialization_hook_and_fp16_and_fault_tolerance_flags() -> None:
    def initialization_hook(runner):
        print("NCCL DEBUG SET")
        # Need this for avoiding a connection restart issue
        os.environ["NCCL_SOCKET_IFNAME"] = "^docker0,lo"
        os.environ["NCCL_LL_THRESHOLD"] = "0"
        os.environ["NCCL_DEBUG"] = "INFO"

    def report_env(config, model, train_iterator, criterion, optimizer, scheduler=None):
        stats = _default_train(config, model, train_iterator, criterion, optimizer, scheduler)
        stats["nccl_debug"] = os.environ.get("NCCL_DEBUG")
        return stats

    trainer = PyTorchTrainer(
        model_creator,
        data_creator,
        optimizer_creator,
        loss_creator=nn.MSELoss,
        initialization_hook=initialization_hook,
        train_function=report_env,
        config={"lr": 0.001},
        num_replicas=NUM_REPLICAS,
        use_gpu=False,
        use_fp16=True,
    )
    N = 2
    stats = trainer.train(max_retries=N, checkpoint="auto")
    assert stats["nccl_debug"] == "INFO"
    assert stats["num_samples"] == 256
    trainer.shutdown()


# --- Simultaneous Multi-model Training (DCGAN) -------------------------------------------
latent_vector_size = 8


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(latent_vector_size, 16, 4, 1, 0, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(True),
            nn.ConvTranspose2d(16, 1, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, 16, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(16, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


def inception_score(fake: torch.Tensor) -> tuple[float, float]:
    """Stand-in for the seed's undefined helper: the spread of the generated pixels."""
    return float(fake.detach().std()), 0.0


def gan_data_creator(config):
    g = torch.Generator().manual_seed(0)
    images = torch.tanh(torch.randn(64, 1, 8, 8, generator=g))
    return TensorDataset(images), TensorDataset(images[:32])


def gan_model_creator(config):
    netD = Discriminator()
    netD.apply(weights_init)

    netG = Generator()
    netG.apply(weights_init)
    return netD, netG


def gan_optimizer_creator(models, config):
    net_d, net_g = models
    discriminator_opt = optim.Adam(
        net_d.parameters(), lr=config.get("lr", 0.01), betas=(0.5, 0.999)
    )
    generator_opt = optim.Adam(net_g.parameters(), lr=config.get("lr", 0.01), betas=(0.5, 0.999))
    return discriminator_opt, generator_opt


def train(config, models, dataloader, criterion, optimizers, scheduler=None):
    """Runs one standard training pass over the train_iterator. (Seed 002's DCGAN body.)"""

    netD, netG = models
    optimD, optimG = optimizers
    real_label = 1.0
    fake_label = 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    for i, data in enumerate(dataloader, 0):  # noqa: B007 (seed code)
        netD.zero_grad()
        real_cpu = data[0].to(device)
        b_size = real_cpu.size(0)
        label = torch.full((b_size,), real_label, device=device)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()

        noise = torch.randn(b_size, latent_vector_size, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimD.step()

        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        optimG.step()

        is_score, is_std = inception_score(fake)  # noqa: RUF059 (seed code)

    return {"loss_g": errG.item(), "loss_d": errD.item(), "inception": is_score}


def custom_validate(config, model, val_iterator, criterion, scheduler=None):
    """Runs one standard validation pass over the val_iterator."""
    return {"validation_accuracy": 0.5}


def test_dcgan_two_models_custom_train_and_validation() -> None:
    trainer = PyTorchTrainer(
        gan_model_creator,
        gan_data_creator,
        gan_optimizer_creator,
        nn.BCELoss,
        train_function=train,
        validation_function=custom_validate,
        config={"lr": 0.01},
        num_replicas=NUM_REPLICAS,
        batch_size=16,
    )
    try:
        first = trainer.train()
        second = trainer.train()
        for stats in (first, second):
            assert set(stats) >= {"loss_g", "loss_d", "inception", "epoch"}
            assert all(torch.isfinite(torch.tensor(stats[k])) for k in ("loss_g", "loss_d"))
        assert second["epoch"] == 2
        assert trainer.validate() == {"validation_accuracy": 0.5}
        netD, netG = trainer.get_model()
        assert isinstance(netD, Discriminator) and isinstance(netG, Generator)
        # The generator really trained: its weights left their DCGAN initialisation.
        _fresh_d, fresh_g = gan_model_creator({})
        assert not torch.equal(netG.main[0].weight, fresh_g.main[0].weight)
        assert netG(torch.randn(2, latent_vector_size, 1, 1)).shape == (2, 1, 8, 8)
    finally:
        trainer.shutdown()


def test_multi_model_custom_train_in_the_config_last_style() -> None:
    """Seed 002's ``custom_train(models, dataloader, criterion, optimizers, config)``."""

    def two_model_creator(config):
        torch.manual_seed(0)
        return nn.Linear(1, 1), nn.Linear(1, 1)

    def two_optimizer_creator(models, config):
        return tuple(torch.optim.SGD(m.parameters(), lr=0.05) for m in models)

    def train(model, dataloader, criterion, optimizer, config):
        return _default_train(config, model, dataloader, criterion, optimizer)

    def custom_train(models, dataloader, criterion, optimizers, config):
        result = {}
        for i, (model, optimizer) in enumerate(zip(models, optimizers)):  # noqa: B905 (seed code)
            result[f"model_{i}"] = train(model, dataloader, criterion, optimizer, config)
        return result

    trainer = PyTorchTrainer(
        two_model_creator,
        data_creator,
        two_optimizer_creator,
        loss_creator=nn.MSELoss,
        train_function=custom_train,
        num_replicas=NUM_REPLICAS,
    )
    try:
        stats = trainer.train()
        # Both models trained over the same (re-iterable) pass of the data.
        assert stats["model_0"]["num_samples"] == stats["model_1"]["num_samples"] == 128
        with pytest.raises(Exception, match="validation_function"):
            trainer.validate()  # two models and no custom validation function
    finally:
        trainer.shutdown()
