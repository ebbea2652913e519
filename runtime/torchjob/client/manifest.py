"""Reading TorchJob manifests from YAML files, with errors that name the file and field.

Used by the CLI (``torchjob run`` / ``torchjob submit``) and by the SDK's
``TorchJobClient.create`` when given a path. When the lead's pydantic models in
``torchjob.api`` are importable, the manifest is validated with them too; the
checks here cover what the local runner itself relies on, so ``torchjob run``
can give a precise message even before the API models exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from torchjob.contract import GROUP

API_VERSION = f"{GROUP}/v1alpha1"
KIND = "TorchJob"


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
    """A checked TorchJob manifest: the raw dict plus the fields torchjob reads locally."""

    source: str
    raw: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.raw["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        ns = self.raw["metadata"].get("namespace")
        return str(ns) if ns else None

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.raw["spec"]
        return spec

    @property
    def replicas(self) -> int:
        return int(self.spec.get("replicas", 1))

    @property
    def nproc_per_node(self) -> int | str:
        value = self.spec.get("nprocPerNode", 1)
        return value if value == "gpu" else int(value)

    @property
    def backend(self) -> str:
        return str(self.spec.get("backend", "auto"))

    @property
    def min_replicas(self) -> int:
        elastic = self.spec.get("elastic") or {}
        return int(elastic.get("minReplicas", self.replicas))

    @property
    def max_replicas(self) -> int:
        elastic = self.spec.get("elastic") or {}
        return int(elastic.get("maxReplicas", self.replicas))

    @property
    def elastic(self) -> bool:
        return bool(self.spec.get("elastic"))

    @property
    def max_restarts(self) -> int:
        policy = self.spec.get("failurePolicy") or {}
        return int(policy.get("maxRestarts", 0))

    @property
    def checkpoint_path(self) -> str:
        ckpt = self.spec.get("checkpoint") or {}
        return str(ckpt.get("path", "") or "")

    def container(self) -> LocalContainer:
        """The template's first container, as the local runner starts it."""
        c = self.spec["template"]["spec"]["containers"][0]
        argv = [str(a) for a in (c.get("command") or [])] + [str(a) for a in (c.get("args") or [])]
        env: dict[str, str] = {}
        for item in c.get("env") or []:
            if "value" in item:
                env[str(item["name"])] = str(item["value"])
        resources = c.get("resources") or {}
        gpus = 0
        for section in ("limits", "requests"):
            raw = (resources.get(section) or {}).get("nvidia.com/gpu")
            if raw is not None:
                gpus = max(gpus, int(raw))
        return LocalContainer(
            name=str(c.get("name", "worker")),
            argv=argv,
            env=env,
            working_dir=c.get("workingDir"),
            gpu_request=gpus,
        )


def _require(cond: bool, source: str, field: str, problem: str) -> None:
    if not cond:
        raise ManifestError(source, field, problem)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_manifest(doc: Any, source: str = "") -> Manifest:
    """Check the fields torchjob depends on; raise :class:`ManifestError` naming the first bad one."""
    _require(
        isinstance(doc, Mapping), source, "<document>", "expected a mapping (a TorchJob object)"
    )
    _require(
        doc.get("apiVersion") == API_VERSION,
        source,
        "apiVersion",
        f"expected {API_VERSION!r}, got {doc.get('apiVersion')!r}",
    )
    _require(doc.get("kind") == KIND, source, "kind", f"expected {KIND!r}, got {doc.get('kind')!r}")
    meta = doc.get("metadata")
    _require(isinstance(meta, Mapping), source, "metadata", "is required")
    name = meta.get("name")
    _require(
        isinstance(name, str) and bool(name),
        source,
        "metadata.name",
        "is required (a DNS-1035 name)",
    )
    spec = doc.get("spec")
    _require(isinstance(spec, Mapping), source, "spec", "is required")
    replicas = spec.get("replicas", 1)
    _require(
        _is_int(replicas) and replicas >= 1,
        source,
        "spec.replicas",
        f"must be an integer >= 1, got {replicas!r}",
    )
    nproc = spec.get("nprocPerNode", 1)
    _require(
        nproc == "gpu" or (_is_int(nproc) and nproc >= 1),
        source,
        "spec.nprocPerNode",
        f"must be an integer >= 1 or 'gpu', got {nproc!r}",
    )
    backend = spec.get("backend", "auto")
    _require(
        backend in ("auto", "nccl", "gloo"),
        source,
        "spec.backend",
        f"must be one of auto, nccl, gloo; got {backend!r}",
    )
    elastic = spec.get("elastic")
    if elastic is not None:
        _require(isinstance(elastic, Mapping), source, "spec.elastic", "must be a mapping")
        lo = elastic.get("minReplicas", replicas)
        hi = elastic.get("maxReplicas", replicas)
        _require(
            _is_int(lo) and lo >= 1, source, "spec.elastic.minReplicas", f"must be >= 1, got {lo!r}"
        )
        _require(
            _is_int(hi) and hi >= lo,
            source,
            "spec.elastic.maxReplicas",
            f"must be >= minReplicas ({lo}), got {hi!r}",
        )
    template = spec.get("template")
    _require(
        isinstance(template, Mapping), source, "spec.template", "is required (a PodTemplateSpec)"
    )
    pod_spec = template.get("spec")
    _require(isinstance(pod_spec, Mapping), source, "spec.template.spec", "is required")
    containers = pod_spec.get("containers")
    _require(
        isinstance(containers, list) and len(containers) >= 1,
        source,
        "spec.template.spec.containers",
        "must list at least one container",
    )
    for i, c in enumerate(containers):
        field = f"spec.template.spec.containers[{i}]"
        _require(isinstance(c, Mapping), source, field, "must be a mapping")
        for key in ("command", "args"):
            value = c.get(key)
            _require(
                value is None
                or (
                    isinstance(value, list) and all(isinstance(v, str | int | float) for v in value)
                ),
                source,
                f"{field}.{key}",
                "must be a list of strings",
            )
        for j, item in enumerate(c.get("env") or []):
            _require(
                isinstance(item, Mapping) and isinstance(item.get("name"), str),
                source,
                f"{field}.env[{j}].name",
                "is required",
            )
    _validate_with_api(doc, source)
    return Manifest(source=source, raw=dict(doc))


def _validate_with_api(doc: Mapping[str, Any], source: str) -> None:
    """Validate with the pydantic models of ``torchjob.api`` when they exist."""
    try:
        from torchjob import api
    except ImportError:  # pragma: no cover - api is part of the package
        return
    model = getattr(api, "TorchJob", None)
    if model is None:
        return
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover
        return
    try:
        model.model_validate(dict(doc))
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in first["loc"])
        raise ManifestError(source, loc.replace(".[", "["), first["msg"]) from e


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
