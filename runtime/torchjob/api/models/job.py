"""The TorchJob resource: its API identity and the whole object as ``kubectl apply`` sends it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from torchjob.api.models.base import _Model, _Passthrough
from torchjob.api.models.spec import TorchJobSpec
from torchjob.api.models.status import TorchJobStatus
from torchjob.contract import GROUP as GROUP  # one definition: the label prefix too

VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TorchJob"
PLURAL = "torchjobs"
SINGULAR = "torchjob"
SHORT_NAMES = ["tj"]


class ObjectMeta(_Passthrough):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class TorchJob(_Model):
    """A whole TorchJob object, as ``kubectl apply -f job.yaml`` sends it."""

    api_version: Literal["torchjob.io/v1alpha1"] = "torchjob.io/v1alpha1"
    kind: Literal["TorchJob"] = "TorchJob"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TorchJobSpec
    status: TorchJobStatus | None = None
