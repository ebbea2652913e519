"""torchjob.client: the Python SDK (cluster) and the local runner for TorchJob manifests.

``TorchJobClient`` talks to a cluster through the official ``kubernetes``
client; ``run_local`` runs a manifest as local processes with the same env
contract. Importing this package imports neither torch nor kubernetes (the client
imports ``kubernetes`` when constructed).
"""

from torchjob.client.client import TorchJobClient
from torchjob.client.errors import (
    KubeconfigError,
    MissingClientDependency,
    TorchJobAlreadyExists,
    TorchJobClientError,
    TorchJobInvalid,
    TorchJobNotFound,
    WaitTimeout,
)
from torchjob.client.local import LocalRunResult, run_local
from torchjob.client.logs import LogLine
from torchjob.client.manifest import (
    Manifest,
    ManifestError,
    check_manifest,
    load_manifest,
    load_manifests,
)
from torchjob.client.table import JobTable

__all__ = [
    "JobTable",
    "KubeconfigError",
    "LocalRunResult",
    "LogLine",
    "Manifest",
    "ManifestError",
    "MissingClientDependency",
    "TorchJobAlreadyExists",
    "TorchJobClient",
    "TorchJobClientError",
    "TorchJobInvalid",
    "TorchJobNotFound",
    "WaitTimeout",
    "check_manifest",
    "load_manifest",
    "load_manifests",
    "run_local",
]
