"""``Checkpoint``: a directory of files, local or on any fsspec filesystem (Ray Train's API)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.core import url_to_fs

from torchjob.checkpoint import (
    MANIFEST,
    MARKER,
    CheckpointError,
    CheckpointStorage,
    CommittedCheckpoint,
    committed_at,
)

if TYPE_CHECKING:
    from torchjob.train.state import StateCheckpoint, TrainState

_METADATA = ".torchjob_metadata.json"
_DCP_METADATA = ".metadata"


class Checkpoint:
    """A directory of checkpoint files. Create one with :meth:`from_directory` and ``report`` it."""

    def __init__(
        self, path: str | os.PathLike[str], filesystem: fsspec.AbstractFileSystem | None = None
    ) -> None:
        raw = os.fspath(path)
        if filesystem is None:
            filesystem, stripped = url_to_fs(raw)
            self._url = raw
        else:
            stripped = raw
            self._url = raw
        self.filesystem: fsspec.AbstractFileSystem = filesystem
        self.path: str = stripped

    def __repr__(self) -> str:
        return f"Checkpoint(path={self._url!r})"

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        return cls(path)

    @classmethod
    def from_state(cls, state: TrainState | Any) -> StateCheckpoint:
        """A sharded checkpoint of ``state`` (a :class:`~torchjob.train.TrainState`), to pass to
        ``report`` on every rank: each rank writes its own shards through DCP
        (``torchjob.train.state`` has the loop)."""
        from torchjob.train.state import StateCheckpoint

        return StateCheckpoint(state)

    @property
    def url(self) -> str:
        """The checkpoint's URL or local path, as given."""
        return self._url

    @property
    def is_sharded(self) -> bool:
        """Whether this directory holds a sharded (DCP) checkpoint, for :meth:`load_state`."""
        return bool(self.filesystem.exists(f"{self.path}/{_DCP_METADATA}"))

    def load_state(self, state: TrainState | Any) -> None:
        """Load this sharded checkpoint into ``state``, on every rank at once (collective).

        Works at any world size (DCP reshards; each rank reads only what its shards need) and
        outside a process group (one process loads everything). A committed checkpoint's files
        are verified against its manifest first: a missing, truncated or corrupt file is a
        ``CheckpointError`` naming it."""
        from torchjob.train import _sharded

        _sharded.load(self.url, state)

    @property
    def _is_local(self) -> bool:
        proto = self.filesystem.protocol
        return "file" in ((proto,) if isinstance(proto, str) else tuple(proto))

    def _require(self) -> tuple[CheckpointStorage, CommittedCheckpoint] | None:
        """A directory, and, when it was written as a checkpoint, a committed one: a half-written
        checkpoint or a missing or corrupt manifest is a ``CheckpointError`` naming the file."""
        if not self.filesystem.isdir(self.path):
            raise CheckpointError(self._url, "does not exist or is not a directory")
        return committed_at(self._url)

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files (the checkpoint itself when local)."""
        if self._is_local:
            self._require()
            yield self.path
            return
        tmp = tempfile.mkdtemp(prefix="torchjob-ckpt-")
        try:
            self.to_directory(tmp)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the files into ``path`` (a new temporary directory by default), verified
        against the manifest when this is a committed checkpoint."""
        found = self._require()
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="torchjob-ckpt-")
        os.makedirs(dest, exist_ok=True)
        if found is not None:
            storage, committed = found
            storage.download(committed, dest)
            return dest
        for src in self.filesystem.find(self.path):
            rel = src[len(self.path.rstrip("/")) + 1 :]
            if rel in (MANIFEST, MARKER):
                continue
            target = Path(dest) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self.filesystem.get_file(src, str(target))
        return dest

    # --- metadata (small JSON next to the files) ------------------------------------
    def get_metadata(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.filesystem.cat_file(f"{self.path}/{_METADATA}"))
        except FileNotFoundError:
            return {}
        return data

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        self.filesystem.pipe_file(f"{self.path}/{_METADATA}", json.dumps(metadata).encode())

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        self.set_metadata({**self.get_metadata(), **metadata})
