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


class WaitTimeout(TorchJobClientError):
    """A wait for a phase ran out of time; the message carries the last status seen."""
