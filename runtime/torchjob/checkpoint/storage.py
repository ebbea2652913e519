"""Checkpoint storage on any fsspec filesystem, with atomic commit and retention.

Layout of a run directory (``<storage_path>/<name>``)::

    checkpoint_000003/            user files + _torchjob_manifest.json + _COMMITTED
    .tmp-checkpoint_000004-ab12/  a save in progress (or a crashed one): never read

Commit protocol: files are written under a temporary name and fsynced, the
manifest (sizes and sha256 of every file, metrics, data position) is written and
fsynced, the directory is renamed to its final name, and last the ``_COMMITTED``
marker, holding the manifest's sha256, is written and fsynced. Object stores
have no atomic directory rename, so there the marker alone decides: a directory
without a valid marker is not a checkpoint. A crash at any point therefore leaves
either the previous checkpoints or a new complete one, never a partial one that
looks valid. Loading verifies every file against the manifest.

On an object store (any fsspec filesystem but a local path or ``memory://``) every remote
call is retried after a transient failure, and the bucket is checked once at start-up:
bad credentials or a missing bucket raise a ``CheckpointError`` naming the bucket
(``torchjob.checkpoint.remote``). Every failure of the store is a ``CheckpointError``
naming the checkpoint's path.

Only rank 0 calls this module during training; other ranks get checkpoint
contents from rank 0 by broadcast (see ``torchjob.train``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from torchjob.checkpoint.errors import CheckpointError
from torchjob.checkpoint.manifest import (
    DIR_RE,
    MANIFEST,
    MARKER,
    RESERVED,
    CommittedCheckpoint,
    checkpoint_dir_name,
    jsonable,
    rank_checkpoints,
    sha256_file,
)
from torchjob.checkpoint.remote import LOCAL_PROTOCOLS, Retry, check_access, with_retries


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _local_files(local_dir: str) -> dict[str, str]:
    """Relative path -> absolute path of every regular file under ``local_dir``."""
    root = Path(local_dir)
    if not root.is_dir():
        raise CheckpointError(local_dir, "is not a directory")
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            if rel in RESERVED:
                continue
            out[rel] = str(p)
    return out


class CheckpointStorage:
    """One run directory of checkpoints, on a local path, a PVC or an object store."""

    def __init__(self, url: str, *, retry: Retry | None = None, check: bool = True) -> None:
        """``check``: on an object store, fail now (a ``CheckpointError`` naming the bucket)
        on bad credentials or a missing bucket; ``retry``: how transient failures are retried."""
        self.url = url.rstrip("/") or "/"
        self.fs, self.root = url_to_fs(self.url)
        protocols = _protocols(self.fs)
        self.is_local = "file" in protocols
        self.is_remote = not LOCAL_PROTOCOLS.intersection(protocols)
        self.retry = retry or Retry()
        if check and self.is_remote:
            check_access(self.fs, protocols[0], self.url, self.root, self.retry)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the filesystem; on an object store retried after transient failures,
        and a failure other than a missing object is a ``CheckpointError`` saying what failed."""
        if not self.is_remote:
            return fn(*args)
        try:
            return with_retries(what, self.retry, fn, *args)
        except (FileNotFoundError, CheckpointError):
            raise
        except Exception as e:
            raise CheckpointError(self.url, f"{what} failed: {e!r}") from e

    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def _url_of(self, name: str) -> str:
        if self.is_local:
            return self._join(name)
        return f"{self.url}/{name}"

    # --- writing --------------------------------------------------------------------
    def next_index(self) -> int:
        """One past every index ever used here, complete or not, so names never collide."""
        used = [0]
        for name in self._names():
            m = DIR_RE.match(name) or re.match(r"^\.tmp-checkpoint_(\d+)-", name)
            if m:
                used.append(int(m.group(1)))
        return max(used) + 1

    def commit(
        self,
        local_dir: str,
        *,
        metrics: dict[str, Any] | None = None,
        data_positions: list[dict[str, Any]] | None = None,
        index: int | None = None,
        verify: Callable[[], None] | None = None,
    ) -> CommittedCheckpoint:
        """Copy ``local_dir`` in as the next checkpoint and commit it atomically.

        ``verify`` runs after the files are copied and before the checkpoint is marked
        committed; if it raises, nothing is committed (the copy is left as incomplete)."""
        files = _local_files(local_dir)
        index = self.next_index() if index is None else index
        name = checkpoint_dir_name(index)
        manifest = {
            "format": 1,
            "index": index,
            "created_at": time.time(),
            "metrics": jsonable(metrics or {}),
            "data_positions": data_positions or [],
            "files": {
                rel: {"size": os.path.getsize(p), "sha256": sha256_file(p)}
                for rel, p in files.items()
            },
        }
        manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
        marker_bytes = hashlib.sha256(manifest_bytes).hexdigest().encode()
        final = self._join(name)
        try:
            if self.is_local:
                self._commit_local(files, name, manifest_bytes, marker_bytes, verify)
            else:
                self._commit_remote(files, final, manifest_bytes, marker_bytes, verify)
        except CheckpointError:
            raise
        except Exception as e:
            if not (isinstance(e, OSError) or self.is_remote):
                raise
            raise CheckpointError(self._url_of(name), f"saving failed: {e!r}") from e
        return self._from_manifest(name, manifest)

    def _commit_remote(
        self,
        files: dict[str, str],
        final: str,
        manifest_bytes: bytes,
        marker_bytes: bytes,
        verify: Callable[[], None] | None,
    ) -> None:
        """No rename on an object store: files, then the manifest, then the marker, each
        retried on its own (an upload rewrites the same key)."""
        self.fs.makedirs(final, exist_ok=True)
        for rel, p in files.items():
            self._call(f"uploading {final}/{rel}", self.fs.put_file, p, f"{final}/{rel}")
        self._call(
            f"writing {final}/{MANIFEST}", self.fs.pipe_file, f"{final}/{MANIFEST}", manifest_bytes
        )
        if verify is not None:
            verify()
        self._call(
            f"writing {final}/{MARKER}", self.fs.pipe_file, f"{final}/{MARKER}", marker_bytes
        )

    def _commit_local(
        self,
        files: dict[str, str],
        name: str,
        manifest_bytes: bytes,
        marker_bytes: bytes,
        verify: Callable[[], None] | None,
    ) -> None:
        os.makedirs(self.root, exist_ok=True)
        tmp = self._join(f".tmp-{name}-{uuid.uuid4().hex[:8]}")
        os.makedirs(tmp)
        for rel, src in files.items():
            dst = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)
            with open(dst, "rb+") as f:
                os.fsync(f.fileno())
        _write_synced(os.path.join(tmp, MANIFEST), manifest_bytes)
        _fsync_dir(tmp)
        if verify is not None:
            verify()
        final = self._join(name)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        marker_tmp = os.path.join(final, f".{MARKER}.tmp")
        _write_synced(marker_tmp, marker_bytes)
        os.rename(marker_tmp, os.path.join(final, MARKER))
        _fsync_dir(final)

    # --- reading --------------------------------------------------------------------
    def _names(self) -> list[str]:
        if self.is_remote:
            # Other processes and pods write here: never trust a cached listing.
            self.fs.invalidate_cache(self.root)
        try:
            entries = self._call(f"listing {self.root}", self.fs.ls, self.root, False)
        except FileNotFoundError:
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def _read_manifest(self, name: str) -> dict[str, Any] | None:
        """The manifest of a committed directory; ``None`` when it has no marker (incomplete)."""
        base = self._join(name)
        try:
            marker = self._call(f"reading {base}/{MARKER}", self.fs.cat_file, f"{base}/{MARKER}")
        except FileNotFoundError:
            return None
        path = self._url_of(name)
        try:
            manifest_bytes = self._call(
                f"reading {base}/{MANIFEST}", self.fs.cat_file, f"{base}/{MANIFEST}"
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

    def _from_manifest(self, name: str, manifest: dict[str, Any]) -> CommittedCheckpoint:
        return CommittedCheckpoint(
            index=int(manifest["index"]),
            path=self._url_of(name),
            metrics=dict(manifest.get("metrics", {})),
            data_positions=list(manifest.get("data_positions", [])),
            files=dict(manifest.get("files", {})),
            created_at=float(manifest.get("created_at", 0.0)),
        )

    def list_committed(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints by index; incomplete ones are skipped, corrupt markers raise."""
        out = []
        for name in sorted(self._names()):
            if not DIR_RE.match(name):
                continue
            manifest = self._read_manifest(name)
            if manifest is not None:
                out.append(self._from_manifest(name, manifest))
        return sorted(out, key=lambda c: c.index)

    def latest_committed(self) -> CommittedCheckpoint | None:
        committed = self.list_committed()
        return committed[-1] if committed else None

    def read_files(self, ckpt: CommittedCheckpoint) -> dict[str, bytes]:
        """Every file of ``ckpt``, verified against its manifest."""
        base = self._join(ckpt.path.rstrip("/").rsplit("/", 1)[-1])
        out: dict[str, bytes] = {}
        for rel, meta in ckpt.files.items():
            try:
                data = self._call(f"reading {base}/{rel}", self.fs.cat_file, f"{base}/{rel}")
            except FileNotFoundError:
                raise CheckpointError(
                    ckpt.path, f"file {rel} listed in the manifest is missing"
                ) from None
            if len(data) != int(meta["size"]) or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise CheckpointError(
                    ckpt.path, f"file {rel} does not match its checksum (corrupt)"
                )
            out[rel] = data
        return out

    def download(self, ckpt: CommittedCheckpoint, local_dir: str) -> None:
        """Verified copy of ``ckpt`` into ``local_dir``."""
        write_files(self.read_files(ckpt), local_dir)

    # --- housekeeping ---------------------------------------------------------------
    def _rm(self, path: str) -> None:
        self.fs.rm(path, recursive=True)

    def remove_incomplete(self) -> list[str]:
        """Delete leftovers of crashed saves (temporary dirs, directories without a marker)."""
        removed = []
        for name in self._names():
            incomplete = name.startswith(".tmp-checkpoint_") or (
                DIR_RE.match(name) is not None and self._read_manifest(name) is None
            )
            if incomplete:
                self._call(f"deleting {self._join(name)}", self._rm, self._join(name))
                removed.append(name)
        return removed

    def apply_retention(
        self,
        num_to_keep: int | None,
        *,
        score_attribute: str | None = None,
        score_order: str = "max",
    ) -> list[CommittedCheckpoint]:
        """Delete all but the best ``num_to_keep`` (by score, else the newest); returns the deleted.

        The newest checkpoint is always kept as well: resuming needs it.
        """
        if num_to_keep is None:
            return []
        committed = self.list_committed()
        if len(committed) <= num_to_keep:
            return []
        keep = {
            c.index for c in rank_checkpoints(committed, score_attribute, score_order)[:num_to_keep]
        }
        keep.add(committed[-1].index)
        deleted = []
        for c in committed:
            if c.index not in keep:
                name = checkpoint_dir_name(c.index)
                # Remove the marker first: a half-deleted directory must never look committed.
                self._call(
                    f"deleting {self._join(name, MARKER)}", self.fs.rm, self._join(name, MARKER)
                )
                self._call(f"deleting {self._join(name)}", self._rm, self._join(name))
                deleted.append(c)
        return deleted


def write_files(files: dict[str, bytes], local_dir: str) -> None:
    """Materialize ``{relative path: bytes}`` under ``local_dir``."""
    for rel, data in files.items():
        dst = os.path.join(local_dir, rel)
        os.makedirs(os.path.dirname(dst) or local_dir, exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)


def latest_committed(url: str) -> CommittedCheckpoint | None:
    """The newest committed checkpoint of the run directory ``url``, if any."""
    return CheckpointStorage(url).latest_committed()


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
