"""torchjob.train.torch: what ``ray.train.torch`` exports."""

from torchjob.train._prepare import get_device, prepare_data_loader, prepare_model
from torchjob.train.config import TorchConfig
from torchjob.train.trainer import TorchTrainer

__all__ = ["TorchConfig", "TorchTrainer", "get_device", "prepare_data_loader", "prepare_model"]
