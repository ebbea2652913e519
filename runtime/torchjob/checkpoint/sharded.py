"""Sharded checkpoints (every rank writes its own files) under the one commit protocol.

A sharded save writes straight into the run directory, through the steps of
``torchjob.checkpoint.commit``: rank 0 names the directory (:func:`new_target`, the
protocol's ``begin``: a local ``.tmp-checkpoint_N-<id>/``, or ``checkpoint_N/`` on an object
store), every rank writes its files there (DCP's ``__<rank>_<n>.distcp``; the coordinator
also ``.metadata``), each fsynced, and hashes the files it wrote (:func:`hash_files`); once
every rank's files are durable, rank 0 commits (:func:`commit_written`: the protocol's
manifest, rename and ``_COMMITTED`` marker, as for a whole-object checkpoint, without the
copy). The manifest also records ``"sharded": {"format": "dcp", "world_size": N}``.

A rank killed mid-save leaves a directory without a marker, which readers skip and
``remove_incomplete`` deletes. :func:`verify_share` checks a rank's share of a committed
checkpoint's files against its manifest before a load: a missing, truncated or corrupt
file is a ``CheckpointError`` naming it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from torchjob.checkpoint import commit as protocol
from torchjob.checkpoint.commit import CommitTarget
from torchjob.checkpoint.manifest import CommittedCheckpoint
from torchjob.checkpoint.storage import CheckpointStorage, committed_at

SHARDED_FORMAT = "dcp"
"""``manifest["sharded"]["format"]``: files written by ``torch.distributed.checkpoint``."""


def new_target(storage: CheckpointStorage) -> CommitTarget:
    """Rank 0: the next checkpoint's directory for a sharded save (the protocol's step 1)."""
    return protocol.begin(storage, storage.next_index())


def hash_files(storage: CheckpointStorage, base_url: str, rels: list[str]) -> dict[str, Any]:
    """``{rel: {"size", "sha256"}}`` of the files ``rels`` under ``base_url`` (as written)."""
    fs = storage.fs
    out: dict[str, Any] = {}
    for rel in sorted(rels):
        path = _fs_path(storage, base_url, rel)
        h = hashlib.sha256()
        size = 0
        with fs.open(path, "rb") as f:
            while chunk := f.read(1 << 22):
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
    target: CommitTarget,
    files: dict[str, Any],
    *,
    world_size: int,
    metrics: dict[str, Any] | None = None,
    data_positions: list[dict[str, Any]] | None = None,
    report: int | None = None,
) -> CommittedCheckpoint:
    """Rank 0, once every rank's files are durable: the protocol's manifest, (rename,) marker."""
    manifest = protocol.new_manifest(
        target.index,
        files,
        metrics=metrics,
        data_positions=data_positions,
        sharded={"format": SHARDED_FORMAT, "world_size": world_size},
        report=report,
    )
    return protocol.finish(storage, target, manifest)


def is_sharded(ckpt: CommittedCheckpoint | None) -> bool:
    """Whether a committed checkpoint was written sharded (by every rank)."""
    return ckpt is not None and ".metadata" in ckpt.files


def read_committed(url: str) -> tuple[CheckpointStorage, CommittedCheckpoint] | None:
    """The committed checkpoint at directory ``url`` (``storage.committed_at``): ``None`` for a
    directory of the user's own DCP files, a ``CheckpointError`` naming the file for a
    half-written checkpoint or a missing or corrupt manifest."""
    return committed_at(url)


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
