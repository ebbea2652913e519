"""Checkpoints committed in the background: the caller pays for a hard link, not a copy.

``BackgroundCommitter.submit(local_dir, ...)`` hard-links the files of ``local_dir`` into a
staging directory beside it (a copy only where links are impossible, e.g. another
filesystem) and returns; one background thread then runs ``CheckpointStorage.commit`` on the
staged files, with the same atomic protocol and ``_COMMITTED`` marker as a synchronous commit.
The caller may delete ``local_dir`` at once (the staged links keep the data). A caller that
instead rewrites a file of ``local_dir`` in place (same inode) while its commit runs gets a
:class:`CheckpointError` naming the file, and nothing committed: a link cannot protect that.

At most one commit is in flight: ``submit`` waits for the previous one first, so memory and
disk stay bounded and checkpoints commit in the order they were reported. ``wait()`` drains
and re-raises a failed commit's error; a process killed mid-commit leaves at most a
``.tmp-checkpoint_*`` directory, which readers ignore (commit.py), never a checkpoint that
looks committed and is not complete. Its staging directory (named after its host and pid) is
removed by the next ``stage()`` beside it on that host.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from torchjob.checkpoint.errors import CheckpointError
from torchjob.checkpoint.manifest import CommittedCheckpoint
from torchjob.checkpoint.storage import CheckpointStorage


def _fingerprint(staged: str) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size) of every staged file: a write through any link changes it."""
    out: dict[str, tuple[int, int]] = {}
    for root, _dirs, files in os.walk(staged):
        for name in files:
            path = os.path.join(root, name)
            st = os.stat(path)
            out[os.path.relpath(path, staged)] = (st.st_mtime_ns, st.st_size)
    return out


def _unchanged_since(staged: str, before: dict[str, tuple[int, int]], origin: str) -> None:
    """Raise if a staged file changed after staging (its user rewrote it in place)."""
    after = _fingerprint(staged)
    changed = sorted(rel for rel, fp in before.items() if after.get(rel) != fp)
    if changed:
        raise CheckpointError(
            os.path.join(origin, changed[0]),
            "was rewritten while its checkpoint was being committed in the background; "
            "write each checkpoint to a new directory (tempfile.TemporaryDirectory()) or "
            "set CheckpointConfig(async_commit=False)",
        )


_STAGED = ".torchjob-staged-"


def _owner_prefix() -> str:
    """The staging prefix of this process: host and pid, so that a later process on the same
    host can tell a directory left by a killed one from one still in use."""
    return f"{_STAGED}{socket.gethostname()}_{os.getpid()}_"  # no hostname has a "_"


def sweep_orphans(parent: str) -> list[str]:
    """Remove the staging directories in ``parent`` that a process of this host left when it
    was killed mid-commit (SIGKILL, OOM: nothing ran to clean up), and return their names.
    Only this host's, and only a pid that no longer runs: a pod that shares ``parent`` over a
    network filesystem has another hostname, and a live pid's directory may be in flight."""
    host = f"{_STAGED}{socket.gethostname()}_"
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        pid_text = name[len(host) :].split("_", 1)[0]
        if not name.startswith(host) or not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        removed.append(name)
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def stage(local_dir: str) -> str:
    """A new directory beside ``local_dir`` holding the same files (hard links, else copies).
    Staging directories that killed processes of this host left there go first."""
    parent = os.path.dirname(os.path.abspath(local_dir))
    sweep_orphans(parent)
    staged = tempfile.mkdtemp(prefix=_owner_prefix(), dir=parent)
    for root, _dirs, files in os.walk(local_dir):
        rel_root = os.path.relpath(root, local_dir)
        for name in files:
            src = os.path.join(root, name)
            dst = os.path.normpath(os.path.join(staged, rel_root, name))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
    return staged


class BackgroundCommitter:
    """Commits staged checkpoints to one ``CheckpointStorage`` on a background thread."""

    def __init__(
        self,
        storage: CheckpointStorage,
        on_commit: Callable[[CommittedCheckpoint], None] | None = None,
    ) -> None:
        self.storage = storage
        self.on_commit = on_commit
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.committed: list[CommittedCheckpoint] = []

    def submit(
        self,
        local_dir: str,
        *,
        metrics: dict[str, Any] | None = None,
        data_positions: list[dict[str, Any]] | None = None,
        report: int | None = None,
    ) -> None:
        """Stage ``local_dir`` and commit it in the background (after the previous commit)."""
        self.wait()
        staged = stage(local_dir)
        before = _fingerprint(staged)

        def run() -> None:
            try:
                ckpt = self.storage.commit(
                    staged,
                    metrics=metrics,
                    data_positions=data_positions,
                    report=report,
                    verify=lambda: _unchanged_since(staged, before, local_dir),
                )
                self.committed.append(ckpt)
                if self.on_commit is not None:
                    self.on_commit(ckpt)
            except BaseException as e:  # re-raised by wait() in the caller's thread
                self._error = e
            finally:
                shutil.rmtree(staged, ignore_errors=True)

        self._thread = threading.Thread(target=run, name="torchjob-checkpoint-commit", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> CommittedCheckpoint | None:
        """Block until no commit is in flight; re-raise the error of a failed one. Returns the
        latest committed checkpoint of this committer."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self.committed[-1] if self.committed else None
