"""Checkpoint storage on any fsspec filesystem, with atomic commit and retention.

Layout of a run directory (``<storage_path>/<name>``)::

    checkpoint_000003/            user files + _torchjob_manifest.json + _COMMITTED
    .tmp-checkpoint_000004-ab12/  a save in progress (or a crashed one): never read

Commit protocol (``torchjob.checkpoint.commit``, shared with sharded checkpoints): the
files are written into a temporary directory and fsynced, the manifest (size and sha256 of
every file, metrics, data position) is written and fsynced, the directory is renamed to its
final name, and last the ``_COMMITTED`` marker, holding the manifest's sha256. Object stores
have no atomic directory rename, so there the marker alone decides: a directory without a
valid marker is not a checkpoint. Loading verifies every file against the manifest.

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
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from torchjob.checkpoint import commit as protocol
from torchjob.checkpoint.errors import CheckpointError
from torchjob.checkpoint.manifest import (
    DIR_RE,
    MARKER,
    RESERVED,
    CommittedCheckpoint,
    checkpoint_dir_name,
    rank_checkpoints,
)
from torchjob.checkpoint.remote import LOCAL_PROTOCOLS, Retry, check_access, with_retries


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

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
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

    def join(self, *parts: str) -> str:
        """The filesystem path of ``parts`` under the run directory."""
        return "/".join([self.root.rstrip("/"), *parts])

    def url_of(self, name: str) -> str:
        """The URL (a local path on a local store) of directory ``name`` of the run."""
        if self.is_local:
            return self.join(name)
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
        report: int | None = None,
    ) -> CommittedCheckpoint:
        """Copy ``local_dir`` in as the next checkpoint and commit it atomically.

        ``verify`` runs after the files are copied and before the checkpoint is marked
        committed; if it raises, nothing is committed (the copy is left as incomplete)."""
        files = _local_files(local_dir)
        index = self.next_index() if index is None else index
        manifest = protocol.new_manifest(
            index,
            {rel: protocol.file_entry(p) for rel, p in files.items()},
            metrics=metrics,
            data_positions=data_positions,
            report=report,
        )
        target = protocol.begin(self, index)
        protocol.copy_in(self, target, files)
        return protocol.finish(self, target, manifest, verify=verify)

    # --- reading --------------------------------------------------------------------
    def _names(self) -> list[str]:
        if self.is_remote:
            # Other processes and pods write here: never trust a cached listing.
            self.fs.invalidate_cache(self.root)
        try:
            entries = self.call(f"listing {self.root}", self.fs.ls, self.root, False)
        except FileNotFoundError:
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def list_committed(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints by index; incomplete ones are skipped, corrupt markers raise."""
        out = []
        for name in sorted(self._names()):
            if not DIR_RE.match(name):
                continue
            ckpt = protocol.read(self, name)
            if ckpt is not None:
                out.append(ckpt)
        return sorted(out, key=lambda c: c.index)

    def latest_committed(self) -> CommittedCheckpoint | None:
        committed = self.list_committed()
        return committed[-1] if committed else None

    def read_files(self, ckpt: CommittedCheckpoint) -> dict[str, bytes]:
        """Every file of ``ckpt``, verified against its manifest."""
        base = self.join(ckpt.path.rstrip("/").rsplit("/", 1)[-1])
        out: dict[str, bytes] = {}
        for rel, meta in ckpt.files.items():
            try:
                data = self.call(f"reading {base}/{rel}", self.fs.cat_file, f"{base}/{rel}")
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
                DIR_RE.match(name) is not None and protocol.read_manifest(self, name) is None
            )
            if incomplete:
                self.call(f"deleting {self.join(name)}", self._rm, self.join(name))
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
                self.call(
                    f"deleting {self.join(name, MARKER)}", self.fs.rm, self.join(name, MARKER)
                )
                self.call(f"deleting {self.join(name)}", self._rm, self.join(name))
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


def committed_at(url: str) -> tuple[CheckpointStorage, CommittedCheckpoint] | None:
    """The committed checkpoint at directory ``url``, asked for by path; ``None`` when ``url``
    is a directory of the user's own files (no manifest, no marker). A checkpoint directory
    that is half-written (no marker) or whose manifest is missing or corrupt is a
    ``CheckpointError`` naming the file (``torchjob.checkpoint.commit.require``)."""
    parent, sep, name = url.rstrip("/").rpartition("/")
    storage = CheckpointStorage((parent or "/") if sep else ".", check=False)
    if not protocol.is_checkpoint(storage, name):
        return None
    return storage, protocol.require(storage, name)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
