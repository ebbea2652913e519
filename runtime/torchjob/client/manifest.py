"""Reading TorchJob manifests from YAML files, with errors that name the file and field.

Used by the CLI (``torchjob run`` / ``torchjob submit``) and by the SDK's
``TorchJobClient.create`` when given a path. Validation is the pydantic models
of ``torchjob.api`` (the same rules the CRD enforces), so ``torchjob run``
accepts exactly what the cluster would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from torchjob.api.merge import MergeError, resolve
from torchjob.api.models import ObjectMeta, RuntimeRef, TorchJob

Resolver = Callable[[RuntimeRef, "str | None"], "Mapping[str, Any] | None"]
"""Reads the runtime blueprint a manifest's ``spec.runtimeRef`` names (in a namespace, for a
TorchRuntime): the object, or None when it does not exist (``TorchJobClient.get_runtime``)."""


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


def check_manifest(doc: Any, source: str = "", resolver: Resolver | None = None) -> Manifest:
    """Validate ``doc`` with the ``torchjob.api`` models; raise :class:`ManifestError` naming the field.

    The models are the single source of truth: what the API server's CRD rejects,
    this rejects with the same rule, before any request is sent. A job with
    ``spec.runtimeRef`` is checked merged over its blueprint, which ``resolver`` reads
    (``Manifest.job`` is then the merged job; ``raw`` stays what was written).
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
    spec = doc.get("spec")
    if isinstance(spec, Mapping) and spec.get("runtimeRef") is not None:
        return _over_runtime(doc, spec, source, resolver)
    try:
        job = TorchJob.model_validate(dict(doc))
    except ValidationError as e:
        first = e.errors()[0]
        raise ManifestError(source, _field(tuple(first["loc"])), first["msg"]) from e
    return Manifest(source=source, raw=dict(doc), job=job)


def _over_runtime(
    doc: Mapping[str, Any], spec: Mapping[str, Any], source: str, resolver: Resolver | None
) -> Manifest:
    """A job that names a runtime blueprint, checked merged over it."""
    try:
        ref = RuntimeRef.model_validate(spec["runtimeRef"])
    except ValidationError as e:
        first = e.errors()[0]
        sub = _field(tuple(first["loc"]))
        field = "spec.runtimeRef" if sub == "<document>" else f"spec.runtimeRef.{sub}"
        raise ManifestError(source, field, first["msg"]) from e
    meta = ObjectMeta.model_validate(doc.get("metadata") or {})
    if resolver is None:
        raise ManifestError(
            source,
            "spec.runtimeRef",
            f"names {ref.describe()}: a job with a runtime blueprint needs the cluster that "
            "holds it (torchjob submit); torchjob run takes a job written in full",
        )
    blueprint = resolver(ref, meta.namespace)
    if blueprint is None:
        where = (
            f" in namespace {meta.namespace or '(default)'}"
            if ref.kind.value == "TorchRuntime"
            else ""
        )
        raise ManifestError(source, "spec.runtimeRef", f"{ref.describe()} does not exist{where}")
    try:
        merged = resolve(blueprint.get("spec") or {}, spec, source=ref.describe())
    except MergeError as e:
        raise ManifestError(source, e.field, f"{e.message} (from {e.side})") from e
    return Manifest(source=source, raw=dict(doc), job=TorchJob(metadata=meta, spec=merged))


def read_documents(path: str | Path) -> list[tuple[str, Any]]:
    """The YAML documents of a file, each with the source its errors name (``file#i``)."""
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
    return [(source if len(docs) == 1 else f"{source}#{i}", d) for i, d in enumerate(docs)]


def load_manifests(path: str | Path, resolver: Resolver | None = None) -> list[Manifest]:
    """All TorchJob documents of a YAML file (``-`` is not supported: pass a path)."""
    return [check_manifest(d, source, resolver) for source, d in read_documents(path)]


def load_manifest(path: str | Path, resolver: Resolver | None = None) -> Manifest:
    """The single TorchJob in ``path``."""
    docs = load_manifests(path, resolver)
    if len(docs) != 1:
        raise ManifestError(str(path), "<document>", f"expected one TorchJob, found {len(docs)}")
    return docs[0]


def job_dict(job: Any) -> dict[str, Any]:
    """Accept a dict, a :class:`Manifest`, a pydantic ``TorchJob`` or a path to a YAML file."""
    if isinstance(job, Manifest):
        return dict(job.raw)
    if isinstance(job, str | Path):
        return dict(load_manifest(job).raw)
    dump = getattr(job, "model_dump", None)
    if callable(dump):
        dumped: dict[str, Any] = dump(mode="json", by_alias=True, exclude_none=True)
        return dumped
    if isinstance(job, Mapping):
        return dict(check_manifest(job).raw)
    raise TypeError(f"expected a TorchJob dict, model, Manifest or path, got {type(job).__name__}")


def raw_job(job: Any) -> dict[str, Any]:
    """The TorchJob as written (not yet checked): a Manifest's, a file's, a model's, a dict."""
    if isinstance(job, Manifest):
        return dict(job.raw)
    if isinstance(job, str | Path):
        docs = read_documents(job)
        if len(docs) != 1:
            return job_dict(job)  # load_manifest says how many it found
        return dict(docs[0][1])
    dump = getattr(job, "model_dump", None)
    if callable(dump):  # with a blueprint, only what was set: a default would override it
        unset = getattr(getattr(job, "spec", None), "runtime_ref", None) is not None
        dumped: dict[str, Any] = dump(
            mode="json", by_alias=True, exclude_none=True, exclude_unset=unset
        )
        return dumped
    if isinstance(job, Mapping):
        return dict(job)
    return job_dict(job)  # the TypeError


def source_of(job: Any) -> str:
    if isinstance(job, Manifest):
        return job.source
    return str(job) if isinstance(job, str | Path) else ""
