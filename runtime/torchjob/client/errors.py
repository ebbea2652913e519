"""The SDK's own errors: Kubernetes client exceptions never leak out of ``torchjob.client``."""

from __future__ import annotations


class TorchJobClientError(RuntimeError):
    """Base of every error the SDK raises."""


class KubeconfigError(TorchJobClientError):
    """No usable cluster credentials (no kubeconfig, unknown context, not in a pod)."""


class TorchJobNotFound(TorchJobClientError):
    """The TorchJob (or its CRD) does not exist."""


class TorchJobAlreadyExists(TorchJobClientError):
    """A TorchJob with that name already exists in the namespace."""


class TorchJobInvalid(TorchJobClientError):
    """The API server rejected the TorchJob (HTTP 422): ``field`` and ``problem`` say why."""

    def __init__(self, message: str, field: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.problem = problem or message


class WaitTimeout(TorchJobClientError):
    """A wait for a phase ran out of time; the message carries the last status seen."""
