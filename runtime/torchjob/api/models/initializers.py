"""``spec.initializers``: a dataset and a model fetched ONCE, on CPU pods, into a volume every
worker mounts, before any worker pod is created; and ``status.initializers``, how they went.

The volume is a PersistentVolumeClaim the user names (``volume.claimName``): the operator
does not create one, since the storage class and the access mode are the platform's choice
(``ReadWriteMany``, or ``ReadWriteOnce`` with the initialiser and every worker on one node).
An ``emptyDir`` would not do: it is not shared between pods.

The names and URIs are checked by a ``pattern`` the CRD carries too, the mount path by a rule
of the rule table (``rules``: CEL in the CRD and the same check here); an error names the
field (``spec.initializers.dataset.uri: ...``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from torchjob.api.models.base import CEL, _Model
from torchjob.api.models.limits import DNS_SUBDOMAIN, MAX_PATH
from torchjob.api.models.rules import cel_of, enforce

INITIALIZER_KINDS = ("dataset", "model")
"""The initialisers a job may have, in the order they are created and reported."""

URI_PATTERN = (
    r"^(s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?"
    r"|hf://[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+(@[A-Za-z0-9_.\-/]+)?"
    r"|pvc://[a-z0-9]([a-z0-9.\-]*[a-z0-9])?(/.*)?)$"
)
"""``s3://bucket[/key-or-prefix]``, ``hf://org/repo[@revision]`` or ``pvc://claim[/path]``."""
DEFAULT_MOUNT_PATH = "/torchjob/initializers"
_PRESERVE: Any = {"x-kubernetes-preserve-unknown-fields": True}


def _dns_name(name: str | None, what: str) -> str | None:
    if name is not None and not re.match(DNS_SUBDOMAIN, name):
        raise ValueError(
            f"{name!r} is not {what}: lowercase letters, digits, '-' and '.', starting and "
            "ending with a letter or digit"
        )
    return name


class InitializerSource(_Model):
    """Where one initialiser fetches from."""

    uri: str = Field(
        min_length=6,
        max_length=MAX_PATH,
        json_schema_extra={"pattern": URI_PATTERN},
        description=(
            "s3://bucket/key-or-prefix (an S3-compatible store: endpoint and credentials as "
            "AWS_* variables from secretName), hf://org/repo[@revision] (a Hugging Face "
            "repository; HF_TOKEN from secretName), or pvc://claim/path (a PersistentVolumeClaim "
            "of the namespace, mounted read-only)."
        ),
    )
    secret_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        json_schema_extra={"pattern": DNS_SUBDOMAIN},
        description=(
            "A Secret of the namespace whose keys become the initialiser pod's environment "
            "(envFrom): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION; "
            "HF_TOKEN."
        ),
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, uri: str) -> str:
        if not re.match(URI_PATTERN, uri):  # the CRD's pattern, with the forms named
            raise ValueError(
                f"{uri!r} is not s3://bucket/key-or-prefix, hf://org/repo or pvc://claim/path"
            )
        return uri

    @field_validator("secret_name")
    @classmethod
    def _secret(cls, name: str | None) -> str | None:
        return _dns_name(name, "a Secret name")


class InitializerVolume(_Model):
    """The PersistentVolumeClaim the initialisers write to and every worker mounts."""

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        json_schema_extra={"pattern": DNS_SUBDOMAIN},
        description=(
            "An existing PersistentVolumeClaim: ReadWriteMany, or ReadWriteOnce with every pod "
            "of the job on one node (an emptyDir would not be shared between pods)."
        ),
    )
    mount_path: str = Field(
        default=DEFAULT_MOUNT_PATH,
        min_length=2,
        max_length=MAX_PATH,
        description="Where it is mounted; the dataset goes to <mountPath>/dataset, the model to "
        "<mountPath>/model.",
        json_schema_extra={CEL: cel_of("InitializerVolume", "mountPath")},
    )

    @field_validator("claim_name")
    @classmethod
    def _claim(cls, name: str) -> str:
        return str(_dns_name(name, "a PersistentVolumeClaim name"))

    @model_validator(mode="after")
    def _rules(self) -> InitializerVolume:
        enforce("InitializerVolume", self)
        return self


class InitializersSpec(_Model):
    """Data and a model brought to the workers once, before they start."""

    volume: InitializerVolume
    dataset: InitializerSource | None = None
    model: InitializerSource | None = None
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Image with the torchjob CLI (default: the first worker container's).",
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        description="core/v1 ResourceRequirements of the initialiser pods (default: requests "
        "cpu 250m, memory 256Mi; no GPU).",
        json_schema_extra=_PRESERVE,
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="nodeSelector of the initialiser pods (CPU nodes)."
    )
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        description="core/v1 Tolerations of the initialiser pods.",
        json_schema_extra={"items": {"type": "object", **_PRESERVE}},
    )

    @model_validator(mode="after")
    def _something(self) -> InitializersSpec:
        if self.dataset is None and self.model is None:
            raise ValueError("spec.initializers needs a dataset or a model (or both)")
        return self

    def sources(self) -> dict[str, InitializerSource]:
        """The configured initialisers by kind, in ``INITIALIZER_KINDS`` order."""
        found = {"dataset": self.dataset, "model": self.model}
        return {k: s for k in INITIALIZER_KINDS if (s := found[k]) is not None}


class InitializerStatus(_Model):
    """How one initialiser went (``status.initializers[]``)."""

    name: str = Field(description="dataset or model.")
    uri: str
    phase: str = Field(description="Pending, Running, Succeeded or Failed.")
    pod: str | None = None
    bytes: int | None = Field(default=None, description="Bytes in the volume once Succeeded.")
    message: str = ""
    completion_time: str | None = None
