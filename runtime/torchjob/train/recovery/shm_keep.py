"""Where the in-memory restore point outlives its worker process: the pod's shared memory.

A worker's restore point (``torchjob.train.recovery.restore_point``) is the state of its last
completed report, held in host memory. Held in the worker process alone, it dies with the
process, and the driver ends a worker process more often than a node does: a formation
given up because a later generation left out the peer it waited for (a vanished node's
store; ``torchjob.launch.startup.await_ready``) shuts its processes down, and when every pod
of the generation was forming, nobody held the state any more and the next generation
resumed from storage.

So the copies are written into a file of ``/dev/shm`` (the pod's memory-backed ``emptyDir``;
on a laptop, the host's tmpfs), mapped into the worker process: the copy costs what a copy
into private memory costs, and the pages stay when the process goes. The driver owns one
directory per ``fit`` (:func:`make_dir`, removed by :func:`remove_dir` when the fit ends),
each local rank a slot in it: an *arena* file holding every tensor of the state at an
aligned offset, and a *manifest* (the run, the report index, the state's structure with
each tensor replaced by its place in the arena, the RNG states and data positions),
written after the copy completes and removed before the next copy starts, so that a
process killed in the middle of a copy leaves no restore point rather than a torn one. A
new process in the slot (:func:`load`) maps the arena and holds the same restore point
without copying it.

Where there is no room (``posix_fallocate`` fails: a small ``/dev/shm``), or no directory
(``TORCHJOB_RESTORE_POINT_SHM=0``, a host without ``/dev/shm``), the copies stay in the
process's private memory as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchjob.checkpoint.background import pid_alive

log = logging.getLogger(__name__)

SHM: Path = Path("/dev/shm")
PREFIX = "torchjob-rp-"
ALIGN = 64
"""Each tensor's offset in the arena: a multiple of every dtype's size (and a cache line)."""


# --- the driver's directory -------------------------------------------------------------------


def make_dir(root: Path | None = None) -> Path | None:
    """A new directory for one ``fit``'s restore points under ``root`` (``/dev/shm``), or
    None where there is none to write to. Directories left by a driver that is gone (killed
    before :func:`remove_dir`) are removed first: their pages would stay in memory."""
    root = SHM if root is None else root
    if not root.is_dir() or not os.access(root, os.W_OK):
        return None
    for old in root.glob(f"{PREFIX}*"):
        pid = old.name[len(PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or old in _MADE:
            continue
        # A dead driver's, or one of this pid's that this process did not make (a container
        # restarted in the same pod: its driver has the same pid again).
        if int(pid) == os.getpid() or not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    try:
        made = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
    except OSError as err:
        log.warning("torchjob: no restore point directory in %s (%s)", root, err)
        return None
    _MADE.add(made)
    return made


_MADE: set[Path] = set()
"""The directories this process made (a process may run several fits at once)."""


def remove_dir(path: Path | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        _MADE.discard(path)


# --- a worker's slot --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ref:
    """A tensor of the state, as the manifest names it: its place in the arena."""

    offset: int
    shape: tuple[int, ...]
    dtype: Any


@dataclass
class Arena:
    """One block of memory holding every tensor of one restore point's state: a file of the
    slot, mapped (``path``), or private memory (``path`` None: a restore point received by
    broadcast, or packed to be sent)."""

    path: Path | None
    data: Any
    """The whole block as a ``uint8`` tensor."""
    used: int = 0
    pinned: bool = False
    """Page-locked for copies from a GPU (``recovery.device_copy.pin``)."""

    def alloc(self, like: Any) -> Any:
        """A tensor of ``like``'s shape and dtype in the arena, at the next aligned offset."""
        n = like.numel() * like.element_size()
        start = self.used
        self.used = start + (n + ALIGN - 1) // ALIGN * ALIGN
        if self.used > self.data.numel():
            raise ValueError(f"the arena {self.path} holds {self.data.numel()} bytes, not more")
        return self.data[start : start + n].view(like.dtype).view(like.shape)

    def owns(self, t: Any) -> bool:
        return bool(t.untyped_storage().data_ptr() == self.data.untyped_storage().data_ptr())

    @classmethod
    def private(cls, nbytes: int) -> Arena:
        import torch

        return cls(None, torch.empty(max(nbytes, ALIGN), dtype=torch.uint8))


def arena_bytes(state: Any) -> int:
    """The arena ``state``'s tensors take, each at an aligned offset."""
    return sum((t.numel() * t.element_size() + ALIGN - 1) // ALIGN * ALIGN for t in _tensors(state))


class Slot:
    """One worker process's restore point files in the driver's directory.

    A slot belongs to the process that holds its lock (``flock``, let go by the kernel when
    the process dies), not to a local rank: a kept process may change its local rank from
    one generation to the next, and two live processes must never map the same arena (the
    optimizer's state, loaded from it, would be shared between ranks)."""

    def __init__(self, directory: Path, name: str, lock_fd: int) -> None:
        self.dir = directory
        self.name = name
        self.manifest = directory / f"{name}.manifest"
        self._lock_fd = lock_fd
        self.no_room_for: int | None = None
        """The size of the last arena there was no room for: not asked again for that size."""

    @classmethod
    def claim(cls, directory: Path, run: str) -> Slot:
        """This process's slot: the free one (its process gone) that holds the newest restore
        point of ``run``, else a new one."""
        free: list[tuple[int, Slot]] = []
        for lock in sorted(directory.glob("slot-*.lock")):
            fd = _lock_free(lock)
            if fd is None:
                continue
            slot = cls(directory, lock.stem, fd)
            free.append((_index(slot.manifest, run), slot))
        free.sort(key=lambda f: f[0], reverse=True)
        for _, other in free[1:]:
            os.close(other._lock_fd)  # another new process may take it
        if free:
            return free[0][1]
        name = f"slot-{os.getpid()}-{secrets.token_hex(4)}"
        # Locked before it has the name other processes look for: a lock file that appeared
        # unlocked could be taken by another process's claim or prune in between (seen in
        # CI: "could not lock the new restore point slot").
        hidden = directory / f".{name}.lock.new"
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        if not _locked(fd):  # a new name nobody else can see yet
            os.close(fd)
            raise RuntimeError(f"could not lock the new restore point slot {name}")
        os.rename(hidden, directory / f"{name}.lock")
        return cls(directory, name, fd)

    def prune(self, run: str, index: int) -> None:
        """Remove the free slots (their processes gone, nobody in their place) whose restore
        point of ``run`` is older than ``index``, or that hold none: no rank will agree on
        it, and a lost local worker that is never replaced (a job gone on smaller) would keep
        its pages until the fit ends. A slot is removed while locked, its lock file last, and
        :meth:`claim` skips a lock file removed under it."""
        for lock in self.dir.glob("slot-*.lock"):
            if lock.stem == self.name:
                continue
            fd = _lock_free(lock)
            if fd is None:
                continue
            try:
                if _index(self.dir / f"{lock.stem}.manifest", run) < index:
                    for f in [
                        *self.dir.glob(f"{lock.stem}-*.arena"),
                        *self.dir.glob(f"{lock.stem}.*"),
                    ]:
                        if f != lock:
                            f.unlink(missing_ok=True)
                    lock.unlink(missing_ok=True)
            finally:
                os.close(fd)

    def invalidate(self) -> None:
        """Before a copy writes over the arena: until the next :meth:`commit`, no restore point."""
        with contextlib.suppress(FileNotFoundError):
            self.manifest.unlink()

    def allocate(self, nbytes: int) -> Arena | None:
        """A new arena of ``nbytes`` (the slot's older ones removed), or None where the
        shared memory has no room for it (the copy then stays in private memory)."""

        self.invalidate()
        for old in self.dir.glob(f"{self.name}-*.arena"):
            old.unlink(
                missing_ok=True
            )  # a process that maps it keeps its pages until it drops them
        path = self.dir / f"{self.name}-{secrets.token_hex(4)}.arena"
        size = max(nbytes, ALIGN)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not SIGBUS at the copy
            finally:
                os.close(fd)
        except OSError as err:
            path.unlink(missing_ok=True)
            self.no_room_for = nbytes
            log.warning(
                "torchjob: no room for the restore point in %s (%d bytes: %s); it stays in "
                "the worker process's memory",
                self.dir,
                size,
                err,
            )
            return None
        return Arena(path, _mapped(path, size))

    def commit(self, arena: Arena, meta: dict[str, Any], state: Any) -> None:
        """Name ``state`` (its tensors in ``arena``) and ``meta`` as the slot's restore point."""
        import torch

        assert arena.path is not None, "a slot's restore point is in a file of the slot"
        layout = skeleton(state, arena)
        if layout is None:
            raise ValueError("a tensor of the restore point is not in its arena")
        tmp = self.manifest.with_suffix(".tmp")
        torch.save({**meta, "arena": arena.path.name, "state": layout}, tmp)
        os.replace(tmp, self.manifest)

    def load(self, run: str) -> tuple[Arena, dict[str, Any]] | None:
        """The slot's restore point of ``run`` (its state mapped, not copied), if it holds one."""
        import torch

        try:
            meta = torch.load(self.manifest, weights_only=False)
        except FileNotFoundError:
            return None
        except Exception as err:  # a manifest that does not load is no restore point
            log.warning("torchjob: ignoring the restore point %s: %s", self.manifest, err)
            return None
        if meta.get("run") != run:
            return None
        path = self.dir / meta["arena"]
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        arena = Arena(path, _mapped(path, size), used=size)
        meta["state"] = fill(meta["state"], arena)
        return arena, meta


def _lock_free(lock: Path) -> int | None:
    """A descriptor holding the lock of ``lock``'s slot, when its process is gone and the
    file is still the slot's (not removed by :meth:`Slot.prune` in between); else None."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if _locked(fd) and os.fstat(fd).st_ino == lock.stat().st_ino:
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


def _locked(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _index(manifest: Path, run: str) -> int:
    """The report index of ``manifest``'s restore point of ``run``; -1 if it holds none."""
    import torch

    try:
        meta = torch.load(manifest, weights_only=False)
    except Exception:  # absent, or torn: no restore point (load() says which)
        return -1
    return int(meta["index"]) if meta.get("run") == run else -1


def _mapped(path: Path, size: int) -> Any:
    """The file at ``path`` mapped shared, as one ``uint8`` tensor of ``size`` bytes."""
    import torch

    storage: Any = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=size)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def skeleton(state: Any, arena: Arena) -> Any | None:
    """``state`` with each tensor replaced by its place in ``arena``; None when a tensor of
    it is elsewhere."""
    import torch

    if not all(arena.owns(t) for t in _tensors(state)):
        return None

    def ref(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return _Ref(int(t.storage_offset()) * t.element_size(), tuple(t.shape), t.dtype)

    return _tree_map(ref, state)


def fill(layout: Any, arena: Arena) -> Any:
    """The state ``layout`` names (:func:`skeleton`), each tensor a view of ``arena``."""
    import torch

    def view(r: Any) -> Any:
        if not isinstance(r, _Ref):
            return r
        n = torch.Size(r.shape).numel() * torch.empty(0, dtype=r.dtype).element_size()
        return arena.data[r.offset : r.offset + n].view(r.dtype).view(r.shape)

    return _tree_map(view, layout)


def _tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` (nested mappings, lists and tuples) with ``fn`` applied to every leaf."""
    if isinstance(tree, Mapping):
        return {k: _tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [_tree_map(fn, v) for v in tree]
        return tuple(items) if isinstance(tree, tuple) else items
    return fn(tree)


def _tensors(tree: Any) -> list[Any]:
    import torch

    found: list[Any] = []
    _tree_map(lambda x: found.append(x) if isinstance(x, torch.Tensor) else None, tree)
    return found
