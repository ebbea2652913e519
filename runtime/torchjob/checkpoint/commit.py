"""The one commit protocol of a checkpoint, whole-object (``CheckpointStorage.commit``) and
sharded (``torchjob.checkpoint.sharded``) alike, and the one rule of what counts as committed.

Writing a checkpoint ``checkpoint_N`` into a run directory, in this order:

1. :func:`begin` names the directory: on a local path (or a PVC) a temporary
   ``.tmp-checkpoint_N-<id>/``; on an object store (no atomic rename there) the final
   ``checkpoint_N/`` itself;
2. the writer puts its files there (``CommitTarget.write_path``, or ``write_url`` for a writer
   that takes a URL), each fsynced: :func:`copy_in` copies a local directory in; a sharded save
   has every rank write its own files through DCP;
3. :func:`new_manifest` lists every file with its size and sha256 (:func:`file_entry`), with
   the metrics and data positions (and, sharded, the format and world size);
4. :func:`finish`: on a local path the manifest ``_torchjob_manifest.json`` is written and
   fsynced, the directory fsynced, the caller's ``verify`` runs, the directory is renamed to
   ``checkpoint_N`` and its parent fsynced, and last the ``_COMMITTED`` marker (the manifest's
   sha256) is written under a temporary name, fsynced, renamed into place and the directory
   fsynced; on an object store the manifest is uploaded, ``verify`` runs, and the marker is
   uploaded last. Every remote call is retried (``torchjob.checkpoint.remote``).

A crash at any step leaves the previous checkpoints and at most a directory without a valid
marker, never a partial checkpoint that looks committed. The bytes on disk: the manifest is
``json.dumps(manifest, indent=1, sort_keys=True)``, the marker the hex sha256 of those bytes.

Reading (:func:`read`): a directory is committed when its marker holds the sha256 of its
manifest. A directory without a marker is skipped by listings (a save in progress or a
crashed one); asked for by path (:func:`require`), a directory that holds a manifest or a
marker but is not committed is refused with a ``CheckpointError`` naming the missing or
corrupt file. Loading then verifies every file against the manifest (``read_files``,
``sharded.verify_share``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec

from torchjob.checkpoint.errors import CheckpointError
from torchjob.checkpoint.manifest import (
    MANIFEST,
    MARKER,
    CommittedCheckpoint,
    checkpoint_dir_name,
    jsonable,
    sha256_file,
)

FORMAT = 1
"""``manifest["format"]``: the layout of the manifest, unchanged since the first release."""


class Store(Protocol):
    """A run directory as the protocol sees it (``CheckpointStorage`` is one)."""

    url: str
    root: str
    fs: fsspec.AbstractFileSystem
    is_local: bool
    is_remote: bool

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any: ...

    def join(self, *parts: str) -> str: ...

    def url_of(self, name: str) -> str: ...


@dataclass(frozen=True)
class CommitTarget:
    """Where one save writes before it commits (rank 0 names it and broadcasts it when sharded)."""

    index: int
    name: str
    """The final directory name, ``checkpoint_N``."""
    write_path: str
    """Where the files go, as the store's filesystem names it (a local ``.tmp-`` directory,
    or the final key prefix on an object store)."""
    write_url: str
    """The same place as a URL, for writers that open their own filesystem (DCP)."""
    final_url: str
    """The committed checkpoint's URL (a local path on a local store)."""


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def saving(store: Store, name: str) -> Iterator[None]:
    """A failure of the filesystem while saving ``name`` is a ``CheckpointError`` naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:
        if not (isinstance(e, OSError) or store.is_remote):
            raise
        raise CheckpointError(store.url_of(name), f"saving failed: {e!r}") from e


def begin(store: Store, index: int) -> CommitTarget:
    """Step 1: the directory the files of checkpoint ``index`` are written into."""
    name = checkpoint_dir_name(index)
    with saving(store, name):
        if store.is_local:
            os.makedirs(store.root, exist_ok=True)
            tmp = store.join(f".tmp-{name}-{uuid.uuid4().hex[:8]}")
            os.makedirs(tmp)
            return CommitTarget(index, name, tmp, tmp, store.url_of(name))
        final = store.join(name)
        store.fs.makedirs(final, exist_ok=True)
        return CommitTarget(index, name, final, store.url_of(name), store.url_of(name))


def copy_in(store: Store, target: CommitTarget, files: Mapping[str, str]) -> None:
    """Step 2 of a whole-object save: ``{relative path: local file}`` copied in, each fsynced."""
    with saving(store, target.name):
        for rel, src in files.items():
            if not store.is_local:
                dst = f"{target.write_path}/{rel}"
                store.call(f"uploading {dst}", store.fs.put_file, src, dst)
                continue
            dst = os.path.join(target.write_path, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
            with open(dst, "rb+") as f:
                os.fsync(f.fileno())


def file_entry(path: str) -> dict[str, Any]:
    """A local file's manifest entry: ``{"size", "sha256"}``."""
    return {"size": os.path.getsize(path), "sha256": sha256_file(path)}


def new_manifest(
    index: int,
    files: Mapping[str, Mapping[str, Any]],
    *,
    metrics: dict[str, Any] | None = None,
    data_positions: list[dict[str, Any]] | None = None,
    sharded: dict[str, Any] | None = None,
    report: int | None = None,
) -> dict[str, Any]:
    """Step 3: the manifest of checkpoint ``index`` (``files``: relative path -> entry);
    ``report``: the run's report number it was taken at, when known (an optional key: a
    reader of an older manifest gets None)."""
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "index": index,
        "created_at": time.time(),
        "metrics": jsonable(metrics or {}),
        "data_positions": data_positions or [],
        "files": {rel: dict(entry) for rel, entry in sorted(files.items())},
    }
    if sharded is not None:
        manifest["sharded"] = sharded
    if report is not None:
        manifest["report"] = report
    return manifest


def encode_manifest(manifest: dict[str, Any]) -> tuple[bytes, bytes]:
    """The manifest's bytes and the marker's (the manifest's sha256, hex)."""
    manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return manifest_bytes, hashlib.sha256(manifest_bytes).hexdigest().encode()


def finish(
    store: Store,
    target: CommitTarget,
    manifest: dict[str, Any],
    *,
    verify: Callable[[], None] | None = None,
) -> CommittedCheckpoint:
    """Step 4, once the files are durable: manifest, (rename,) marker. ``verify`` runs before
    the checkpoint is marked; if it raises, nothing is committed."""
    manifest_bytes, marker_bytes = encode_manifest(manifest)
    with saving(store, target.name):
        if store.is_local:
            _finish_local(store, target, manifest_bytes, marker_bytes, verify)
        else:
            base = target.write_path
            store.call(
                f"writing {base}/{MANIFEST}",
                store.fs.pipe_file,
                f"{base}/{MANIFEST}",
                manifest_bytes,
            )
            if verify is not None:
                verify()
            store.call(
                f"writing {base}/{MARKER}", store.fs.pipe_file, f"{base}/{MARKER}", marker_bytes
            )
    return checkpoint_of(store, target.name, manifest)


def _finish_local(
    store: Store,
    target: CommitTarget,
    manifest_bytes: bytes,
    marker_bytes: bytes,
    verify: Callable[[], None] | None,
) -> None:
    tmp = target.write_path
    write_synced(os.path.join(tmp, MANIFEST), manifest_bytes)
    fsync_dir(tmp)
    if verify is not None:
        verify()
    final = store.join(target.name)
    os.rename(tmp, final)
    fsync_dir(store.root)
    marker_tmp = os.path.join(final, f".{MARKER}.tmp")
    write_synced(marker_tmp, marker_bytes)
    os.rename(marker_tmp, os.path.join(final, MARKER))
    fsync_dir(final)


# --- reading -----------------------------------------------------------------------------


def checkpoint_of(store: Store, name: str, manifest: Mapping[str, Any]) -> CommittedCheckpoint:
    return CommittedCheckpoint(
        index=int(manifest["index"]),
        path=store.url_of(name),
        metrics=dict(manifest.get("metrics", {})),
        data_positions=list(manifest.get("data_positions", [])),
        files=dict(manifest.get("files", {})),
        created_at=float(manifest.get("created_at", 0.0)),
        report=_report_number(manifest.get("report")),
    )


def _report_number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_manifest(store: Store, name: str) -> dict[str, Any] | None:
    """The manifest of directory ``name``, checked against its marker; ``None`` when it has
    no marker (not committed); a ``CheckpointError`` naming the file when the manifest is
    missing, does not match the marker, or is not JSON."""
    base = store.join(name)
    try:
        marker = store.call(f"reading {base}/{MARKER}", store.fs.cat_file, f"{base}/{MARKER}")
    except FileNotFoundError:
        return None
    path = store.url_of(name)
    try:
        manifest_bytes = store.call(
            f"reading {base}/{MANIFEST}", store.fs.cat_file, f"{base}/{MANIFEST}"
        )
    except FileNotFoundError:
        raise CheckpointError(path, f"is marked committed but {MANIFEST} is missing") from None
    if hashlib.sha256(manifest_bytes).hexdigest().encode() != marker.strip():
        raise CheckpointError(path, f"{MANIFEST} does not match its commit marker (corrupt)")
    try:
        data: dict[str, Any] = json.loads(manifest_bytes)
    except ValueError as e:
        raise CheckpointError(path, f"{MANIFEST} is not valid JSON: {e}") from e
    return data


def read(store: Store, name: str) -> CommittedCheckpoint | None:
    """The committed checkpoint in directory ``name``; ``None`` without a marker."""
    manifest = read_manifest(store, name)
    return None if manifest is None else checkpoint_of(store, name, manifest)


def is_checkpoint(store: Store, name: str) -> bool:
    """Whether directory ``name`` was written by this protocol (holds a manifest or a
    marker), committed or not; a directory of the user's own files holds neither."""
    base = store.join(name)
    return any(
        bool(store.call(f"reading {base}/{f}", store.fs.exists, f"{base}/{f}"))
        for f in (MARKER, MANIFEST)
    )


def require(store: Store, name: str) -> CommittedCheckpoint:
    """The committed checkpoint in directory ``name``, asked for by path: a half-written one
    (no marker) is refused naming the marker, like a missing or corrupt manifest."""
    ckpt = read(store, name)
    if ckpt is None:
        raise CheckpointError(
            store.url_of(name),
            f"{MARKER} is missing: the checkpoint is half-written (its save did not finish)",
        )
    return ckpt
