"""Sharded checkpoints (every rank writes its own files) under the same commit protocol.

A sharded save writes straight into the run directory: every rank writes its files (DCP's
``__<rank>_<n>.distcp``; the coordinator also ``.metadata``) into one directory that
rank 0 named, each file fsynced. Only after every rank's files are durable does rank 0
commit, with the manifest and ``_COMMITTED`` marker of ``torchjob.checkpoint.storage``:

* local paths: the files go to ``.tmp-checkpoint_N-<id>/``; rank 0 writes the manifest
  (size and sha256 of every file, as each rank hashed its own), fsyncs, renames the
  directory to ``checkpoint_N`` and writes the marker: the same steps as a whole-object
  commit, without the copy;
* object stores: the files go to ``checkpoint_N/`` directly (no rename there); the marker,
  written last, alone decides, as for whole-object checkpoints.

A rank killed mid-save leaves a directory without a marker, which readers skip and
``remove_incomplete`` deletes. :func:`verify_share` checks a rank's share of a committed
checkpoint's files against its manifest before a load: a missing, truncated or corrupt
file is a ``CheckpointError`` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from torchjob.checkpoint.errors import CheckpointError
from torchjob.checkpoint.manifest import (
    MANIFEST,
    MARKER,
    CommittedCheckpoint,
    checkpoint_dir_name,
    jsonable,
)
from torchjob.checkpoint.storage import CheckpointStorage, _fsync_dir, _write_synced

SHARDED_FORMAT = "dcp"
"""``manifest["sharded"]["format"]``: files written by ``torch.distributed.checkpoint``."""


@dataclass(frozen=True)
class ShardedTarget:
    """Where one sharded save writes (chosen by rank 0, broadcast to every rank)."""

    index: int
    name: str
    """The final directory name, ``checkpoint_N``."""
    write_url: str
    """Where the ranks write: a local ``.tmp-checkpoint_N-<id>`` path, or the final URL."""
    final_url: str


def new_target(storage: CheckpointStorage) -> ShardedTarget:
    """Rank 0: the next checkpoint's directory for a sharded save."""
    index = storage.next_index()
    name = checkpoint_dir_name(index)
    if storage.is_local:
        os.makedirs(storage.root, exist_ok=True)
        tmp = storage._join(f".tmp-{name}-{uuid.uuid4().hex[:8]}")
        return ShardedTarget(index, name, tmp, storage._join(name))
    return ShardedTarget(index, name, f"{storage.url}/{name}", f"{storage.url}/{name}")


def hash_files(storage: CheckpointStorage, base_url: str, rels: list[str]) -> dict[str, Any]:
    """``{rel: {"size", "sha256"}}`` of the files ``rels`` under ``base_url`` (as written)."""
    fs = storage.fs
    out: dict[str, Any] = {}
    for rel in sorted(rels):
        path = _fs_path(storage, base_url, rel)
        h = hashlib.sha256()
        size = 0
        with fs.open(path, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 22), b""):
                h.update(chunk)
                size += len(chunk)
        out[rel] = {"size": size, "sha256": h.hexdigest()}
    return out


def _fs_path(storage: CheckpointStorage, base_url: str, rel: str) -> str:
    if storage.is_local:
        return os.path.join(base_url, rel)
    from fsspec.core import url_to_fs

    _fs, base = url_to_fs(base_url)
    return f"{base.rstrip('/')}/{rel}"


def commit_written(
    storage: CheckpointStorage,
    target: ShardedTarget,
    files: dict[str, Any],
    *,
    world_size: int,
    metrics: dict[str, Any] | None = None,
    data_positions: list[dict[str, Any]] | None = None,
) -> CommittedCheckpoint:
    """Rank 0, once every rank's files are durable: manifest, (rename,) marker."""
    manifest = {
        "format": 1,
        "index": target.index,
        "created_at": time.time(),
        "metrics": jsonable(metrics or {}),
        "data_positions": data_positions or [],
        "files": dict(sorted(files.items())),
        "sharded": {"format": SHARDED_FORMAT, "world_size": world_size},
    }
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    marker_bytes = hashlib.sha256(manifest_bytes).hexdigest().encode()
    try:
        if storage.is_local:
            _write_synced(os.path.join(target.write_url, MANIFEST), manifest_bytes)
            _fsync_dir(target.write_url)
            os.rename(target.write_url, target.final_url)
            _fsync_dir(storage.root)
            marker_tmp = os.path.join(target.final_url, f".{MARKER}.tmp")
            _write_synced(marker_tmp, marker_bytes)
            os.rename(marker_tmp, os.path.join(target.final_url, MARKER))
            _fsync_dir(target.final_url)
        else:
            base = storage._join(target.name)
            storage._call(
                f"writing {base}/{MANIFEST}",
                storage.fs.pipe_file,
                f"{base}/{MANIFEST}",
                manifest_bytes,
            )
            storage._call(
                f"writing {base}/{MARKER}", storage.fs.pipe_file, f"{base}/{MARKER}", marker_bytes
            )
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(storage._url_of(target.name), f"saving failed: {e!r}") from e
    return storage._from_manifest(target.name, manifest)


def is_sharded(ckpt: CommittedCheckpoint | None, manifest: dict[str, Any] | None = None) -> bool:
    """Whether a committed checkpoint was written sharded (by every rank)."""
    if manifest is not None:
        return isinstance(manifest.get("sharded"), dict)
    return ckpt is not None and ".metadata" in ckpt.files


def read_committed(url: str) -> tuple[CheckpointStorage, CommittedCheckpoint] | None:
    """The committed checkpoint at directory ``url`` (manifest checked against its marker),
    or ``None`` when ``url`` has no marker (not a committed checkpoint)."""
    parent, _, name = url.rstrip("/").rpartition("/")
    storage = CheckpointStorage(parent or "/", check=False)
    manifest = storage._read_manifest(name)
    if manifest is None:
        return None
    return storage, storage._from_manifest(name, manifest)


def verify_share(
    storage: CheckpointStorage, ckpt: CommittedCheckpoint, rank: int, world_size: int
) -> list[str]:
    """Check this rank's share (every ``world_size``-th file) of ``ckpt`` against its manifest;
    returns the problems, each naming a file (empty when the share is intact)."""
    problems: list[str] = []
    rels = sorted(ckpt.files)[rank::world_size]
    for rel in rels:
        meta = ckpt.files[rel]
        try:
            got = hash_files(storage, ckpt.path, [rel])[rel]
        except FileNotFoundError:
            problems.append(f"file {rel} listed in the manifest is missing")
            continue
        if got["size"] != int(meta["size"]):
            problems.append(
                f"file {rel} has {got['size']} bytes, the manifest says {meta['size']} "
                "(truncated or partial)"
            )
        elif got["sha256"] != meta["sha256"]:
            problems.append(f"file {rel} does not match its checksum (corrupt)")
    return problems
