"""Reading TorchJob manifests from YAML files, with errors that name the file and field.

Used by the CLI (``torchjob run`` / ``torchjob submit``) and by the SDK's
``TorchJobClient.create`` when given a path. Validation is the pydantic models
of ``torchjob.api`` (the same rules the CRD enforces), so ``torchjob run``
accepts exactly what the cluster would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from torchjob.api.models import TorchJob


class ManifestError(ValueError):
    """A TorchJob manifest is malformed; the message names the file and the field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {problem}")


@dataclass(frozen=True)
class LocalContainer:
    """What the local runner needs from the template's first container."""

    name: str
    argv: list[str]
    env: dict[str, str]
    working_dir: str | None
    gpu_request: int


@dataclass(frozen=True)
class Manifest:
    """A validated TorchJob manifest: the raw dict and its ``torchjob.api`` model."""

    source: str
    raw: dict[str, Any]
    job: TorchJob

    @property
    def name(self) -> str:
        return str(self.job.metadata.name)

    @property
    def namespace(self) -> str | None:
        return self.job.metadata.namespace or None

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.raw["spec"]
        return spec

    @property
    def replicas(self) -> int:
        return self.job.spec.replicas

    @property
    def nproc_per_node(self) -> int | str:
        return self.job.spec.nproc_per_node

    @property
    def backend(self) -> str:
        return self.job.spec.backend.value

    @property
    def min_replicas(self) -> int:
        return self.job.spec.min_replicas

    @property
    def max_replicas(self) -> int:
        return self.job.spec.max_replicas

    @property
    def elastic(self) -> bool:
        return self.job.spec.elastic is not None

    @property
    def max_restarts(self) -> int:
        return self.job.spec.failure_policy.max_restarts

    @property
    def checkpoint_path(self) -> str:
        ckpt = self.job.spec.checkpoint
        return ckpt.location if ckpt else ""

    def container(self) -> LocalContainer:
        """The template's first container, as the local runner starts it."""
        c = self.job.spec.template.spec.containers[0]
        argv = [str(a) for a in (c.command or [])] + [str(a) for a in (c.args or [])]
        env = {str(e["name"]): str(e["value"]) for e in c.env or [] if "value" in e}
        extra = c.model_extra or {}
        return LocalContainer(
            name=c.name,
            argv=argv,
            env=env,
            working_dir=extra.get("workingDir"),
            gpu_request=self.job.spec.gpus_per_pod(),
        )


def _field(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the manifest spells it: ``spec.containers[0].name``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("int", "str") or part.startswith(("literal[", "function-")):
            continue  # union-branch tags add nothing a person can act on
        else:
            out += f".{part}" if out else str(part)
    return out or "<document>"


def check_manifest(doc: Any, source: str = "") -> Manifest:
    """Validate ``doc`` with the ``torchjob.api`` models; raise :class:`ManifestError` naming the field.

    The models are the single source of truth: what the API server's CRD rejects,
    this rejects with the same rule, before any request is sent.
    """
    if not isinstance(doc, Mapping):
        raise ManifestError(source, "<document>", "expected a mapping (a TorchJob object)")
    name = (
        (doc.get("metadata") or {}).get("name")
        if isinstance(doc.get("metadata"), Mapping)
        else None
    )
    if not (isinstance(name, str) and name):
        raise ManifestError(source, "metadata.name", "is required (a DNS label)")
    try:
        job = TorchJob.model_validate(dict(doc))
    except ValidationError as e:
        first = e.errors()[0]
        raise ManifestError(source, _field(tuple(first["loc"])), first["msg"]) from e
    return Manifest(source=source, raw=dict(doc), job=job)


def load_manifests(path: str | Path) -> list[Manifest]:
    """All TorchJob documents of a YAML file (``-`` is not supported: pass a path)."""
    p = Path(path)
    source = str(p)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ManifestError(source, "<file>", "no such file") from None
    except OSError as e:
        raise ManifestError(source, "<file>", f"cannot be read: {e}") from e
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(source, "<yaml>", f"is not valid YAML: {e}") from e
    if not docs:
        raise ManifestError(source, "<document>", "the file holds no document")
    return [
        check_manifest(d, source if len(docs) == 1 else f"{source}#{i}") for i, d in enumerate(docs)
    ]


def load_manifest(path: str | Path) -> Manifest:
    """The single TorchJob in ``path``."""
    docs = load_manifests(path)
    if len(docs) != 1:
        raise ManifestError(str(path), "<document>", f"expected one TorchJob, found {len(docs)}")
    return docs[0]
