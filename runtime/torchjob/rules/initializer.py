"""What the operator and ``torchjob initialize`` agree on about ``spec.initializers``: the
pods' names and label, where each initialiser writes, the completion marker, the source URI
forms, and the one line an initialiser leaves in its termination message (the operator reads
its byte count into ``status.initializers[].bytes``). Pure: no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from torchjob import contract
from torchjob.api.models import InitializersSpec

LABEL_KIND: Final = f"{contract.GROUP}/initializer"
"""On an initialiser pod: ``dataset`` or ``model``."""
MARKER: Final = ".torchjob-initialized"
"""Written last into an initialiser's target directory (JSON: uri, bytes, files): a later run
with the same URI finds it and fetches nothing."""
SOURCE_ROOT: Final = "/torchjob/source"
"""Where an initialiser pod mounts a ``pvc://claim`` source, read-only."""
ENV_OF: Final = {"dataset": contract.DATASET_PATH, "model": contract.MODEL_PATH}


def pod_name(job: str, kind: str) -> str:
    """``<job>-init-<kind>``: the one pod of initialiser ``kind`` of a job."""
    return f"{job}-init-{kind}"


def target_dir(mount_path: str, kind: str) -> str:
    """Where initialiser ``kind`` writes, and where the workers find it."""
    return f"{mount_path.rstrip('/')}/{kind}"


def worker_paths(spec: InitializersSpec | None) -> dict[str, str]:
    """The workers' env: ``TORCHJOB_DATASET_PATH`` / ``TORCHJOB_MODEL_PATH`` for each
    configured initialiser."""
    if spec is None:
        return {}
    return {ENV_OF[k]: target_dir(spec.volume.mount_path, k) for k in spec.sources()}


@dataclass(frozen=True)
class Source:
    """A parsed initialiser URI: ``scheme`` (s3, hf, pvc), ``root`` (bucket, org/repo or
    claim) and ``path`` (key or prefix, revision, or path in the claim; may be empty)."""

    uri: str
    scheme: str
    root: str
    path: str


_FORMS = {
    "s3": re.compile(r"^s3://(?P<root>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(/(?P<path>.*))?$"),
    "hf": re.compile(
        r"^hf://(?P<root>[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+)(@(?P<path>[A-Za-z0-9_.\-/]+))?$"
    ),
    "pvc": re.compile(r"^pvc://(?P<root>[a-z0-9]([a-z0-9.\-]*[a-z0-9])?)(/(?P<path>.*))?$"),
}


def parse_uri(uri: str) -> Source:
    """``uri`` as a ``Source``; ``ValueError`` naming the URI and the forms otherwise."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    form = _FORMS.get(scheme)
    match = form.match(uri) if form else None
    if match is None:
        raise ValueError(
            f"bad initializer URI {uri!r}: expected s3://bucket/key-or-prefix, hf://org/repo"
            "[@revision] or pvc://claim/path"
        )
    return Source(uri, scheme, match["root"], (match["path"] or "").strip("/"))


def summary(fetched: int, files: int, uri: str, *, cached: bool = False) -> str:
    """The line an initialiser that succeeded leaves in its termination message."""
    how = "found" if cached else "fetched"
    return f"{how} {fetched} bytes in {files} files from {uri}"


_SUMMARY = re.compile(r"^(?:fetched|found) (\d+) bytes in (\d+) files from ")


def fetched_bytes(line: str) -> int | None:
    """The byte count of a ``summary`` line; None for any other line."""
    match = _SUMMARY.match(line)
    return int(match[1]) if match else None
