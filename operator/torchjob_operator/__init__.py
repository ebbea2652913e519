"""torchjob_operator: the kopf operator that reconciles TorchJob objects into worker pods."""

__version__ = "0.1.0"
