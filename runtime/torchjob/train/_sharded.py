"""Sharded save and load of a :class:`~torchjob.train.TrainState` through DCP.

Save (``report(metrics, checkpoint=Checkpoint.from_state(state))``, every rank):

1. wait for this rank's previous save (one in flight);
2. rank 0 names the directory (``torchjob.checkpoint.sharded.new_target``) and broadcasts it;
3. DCP ``async_save`` stages this rank's state into host memory and returns: ``report``
   returns here (with ``async_commit``; otherwise it waits for step 4);
4. on a background thread: DCP writes and fsyncs the files, each rank hashes the files it
   wrote, rank 0 gathers the hashes and commits (manifest, rename, marker), then applies
   retention and announces the checkpoint. Every collective of the save runs on a gloo
   group of its own, created at the first sharded report of a generation, so it never
   interleaves with the training's collectives.

Load (``Checkpoint.load_state(state)``): each rank verifies a share of the files against the
manifest, the ranks agree (any problem is raised on every rank, naming the file), and DCP
loads with resharding: each rank reads the pieces of the files its own shards need.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchjob.checkpoint import CheckpointError, CheckpointStorage, CommittedCheckpoint
from torchjob.checkpoint import sharded as store
from torchjob.checkpoint.commit import CommitTarget

if TYPE_CHECKING:
    import torch.distributed as dist

DCP_METADATA = ".metadata"


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _default_timeout() -> timedelta | None:
    import torch

    d = _dist()
    if d is None:
        return None
    try:
        pg = d.distributed_c10d._get_default_group()
        for dev in ("cpu", "cuda"):
            try:
                t = pg._get_backend(torch.device(dev)).options._timeout
                return t if isinstance(t, timedelta) else None
            except (RuntimeError, AttributeError):
                continue
    except (RuntimeError, AttributeError):
        pass
    return None


def _writer(url: str) -> Any:
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url)
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "file" in protocols:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        return FileSystemWriter(path, sync_files=True, single_file_per_rank=True)
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecWriter

    return FsspecWriter(url, sync_files=True, single_file_per_rank=True)


def _reader(url: str) -> Any:
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url)
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "file" in protocols:
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        return FileSystemReader(path)
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader

    return FsspecReader(url)


def _own_files(metadata: Any, rank: int, url: str) -> list[str]:
    """The files this rank wrote (from DCP's global metadata; rank 0 also ``.metadata``).
    Where the metadata ``save`` returned holds no ``storage_data`` (torch 2.11's async save
    of a GPU state returned such a one, tests/gpu/test_sharded_cuda.py), the checkpoint's own
    ``.metadata`` is read: every rank's save returns after the coordinator wrote it."""
    storage = getattr(metadata, "storage_data", None)
    if storage is None:
        storage = _reader(url).read_metadata().storage_data
    rels = {info.relative_path for info in storage.values()}
    mine = sorted(r for r in rels if r.startswith(f"__{rank}_"))
    return [*mine, DCP_METADATA] if rank == 0 else mine


def new_stager(*, pinned: bool) -> Any:
    """A DCP ``DefaultStager``: synchronous staging into a host copy it keeps."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(
        StagingOptions(
            use_pinned_memory=pinned,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=False,
        )
    )


@functools.cache
def stager_reusable(make: Callable[..., Any]) -> bool:
    """Whether a stager from ``make`` stages more than once. torch 2.11's ``DefaultStager``
    closes its copier after every stage (the next one fails with ``KeyError: <class 'type'>``,
    seen on an H200); later versions keep it for the next save. Probed once on a tiny dict."""
    probe = make(pinned=False)
    try:
        probe.stage({"probe": 0})
        probe.stage({"probe": 0})
    except KeyError:
        return False
    finally:
        probe.close()
    return True


class ShardedSaver:
    """One rank's sharded saves for one generation (``Session.sharded``)."""

    def __init__(
        self,
        storage_url: str,
        *,
        rank: int,
        world_size: int,
        on_commit: Callable[[CommittedCheckpoint], None] | None = None,
    ) -> None:
        self.storage_url = storage_url
        self.rank = rank
        self.world_size = world_size
        self.on_commit = on_commit
        self._storage: CheckpointStorage | None = None
        self._group: dist.ProcessGroup | None = None
        self._stager: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.committed: list[CommittedCheckpoint] = []

    @property
    def storage(self) -> CheckpointStorage:
        if self._storage is None:
            self._storage = CheckpointStorage(self.storage_url)
        return self._storage

    def _pg(self) -> Any:
        d = _dist()
        if d is None:
            return None
        if self._group is None:
            self._group = d.new_group(backend="gloo", timeout=_default_timeout())
        return self._group

    def _staging(self) -> Any:
        """One DCP stager for the generation: it keeps this rank's host copy of the state
        and refreshes it in place at each save (no new allocation, no page faults), pinned
        when CUDA is present. The previous save is finished before the copy is refreshed.
        Where this torch's stager serves one save only (``stager_reusable``), a new one."""
        if self._stager is None or not stager_reusable(new_stager):
            import torch

            self._stager = new_stager(pinned=torch.cuda.is_available())
        return self._stager

    def save(
        self,
        state: Any,
        *,
        metrics: dict[str, Any],
        data_positions: list[dict[str, Any]],
        background: bool,
        report: int | None = None,
    ) -> CommittedCheckpoint | None:
        """Save ``state`` sharded; returns the committed checkpoint (rank 0, not ``background``)
        or ``None`` (committed later in the background, or not rank 0)."""
        from torch.distributed.checkpoint.state_dict_saver import async_save, save

        self.wait()
        d = _dist()
        group = self._pg()
        box: list[Any] = [store.new_target(self.storage) if self.rank == 0 else None]
        if d is not None and self.world_size > 1:
            d.broadcast_object_list(box, src=0, group=group)
        target: CommitTarget = box[0]
        state_dict = state.state_dict()
        writer = _writer(target.write_url)
        if background:
            if "async_stager" in _params(async_save):
                fut = async_save(
                    state_dict,
                    storage_writer=writer,
                    process_group=group,
                    async_stager=self._staging(),
                    no_dist=d is None,
                )
            else:  # torch < 2.7 (Debian trixie's 2.6): DCP stages into a new host copy
                fut = async_save(state_dict, storage_writer=writer, process_group=group)
            upload: Any = getattr(fut, "upload_completion", fut)
            self._start(
                lambda: self._finish(upload.result(), target, metrics, data_positions, report)
            )
            return None
        metadata = save(
            state_dict, storage_writer=writer, process_group=group, **_no_dist(save, d is None)
        )
        return self._finish(metadata, target, metrics, data_positions, report)

    def _finish(
        self,
        metadata: Any,
        target: CommitTarget,
        metrics: dict[str, Any],
        data_positions: list[dict[str, Any]],
        report: int | None = None,
    ) -> CommittedCheckpoint | None:
        """Every rank: hash its files; rank 0: gather them and commit."""
        mine = store.hash_files(
            self.storage, target.write_url, _own_files(metadata, self.rank, target.write_url)
        )
        d = _dist()
        gathered: list[Any] = [mine]
        if d is not None and self.world_size > 1:
            gathered = [None] * self.world_size if self.rank == 0 else []
            d.gather_object(mine, gathered if self.rank == 0 else None, dst=0, group=self._group)
        if self.rank != 0:
            return None
        files: dict[str, Any] = {}
        for part in gathered:
            files.update(part or {})
        ckpt = store.commit_written(
            self.storage,
            target,
            files,
            world_size=self.world_size,
            metrics=metrics,
            data_positions=data_positions,
            report=report,
        )
        self.committed.append(ckpt)
        if self.on_commit is not None:
            self.on_commit(ckpt)
        return ckpt

    def _start(self, work: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                work()
            except BaseException as e:  # re-raised by wait() in the caller's thread
                self._error = e

        self._thread = threading.Thread(target=run, name="torchjob-sharded-save", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> CommittedCheckpoint | None:
        """Block until this rank's save in flight is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self.committed[-1] if self.committed else None


def _agree(problems: list[str]) -> list[str]:
    d = _dist()
    if d is None or d.get_world_size() == 1:
        return problems
    everyone: list[Any] = [None] * d.get_world_size()
    d.all_gather_object(everyone, problems)
    return [p for part in everyone for p in (part or [])]


def _params(fn: Callable[..., Any]) -> set[str]:
    import inspect

    return set(inspect.signature(fn).parameters)


def _no_dist(fn: Callable[..., Any], no_dist: bool) -> dict[str, bool]:
    """``no_dist=`` where DCP takes it; torch < 2.7 infers it (no process group: no_dist)."""
    return {"no_dist": no_dist} if "no_dist" in _params(fn) else {}


def load(url: str, state: Any) -> None:
    """Verify (each rank a share), then DCP-load the checkpoint at ``url`` into ``state`` with
    resharding (``Checkpoint.load_state``)."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from torchjob.train.state import RNG_PREFIX, rng_key

    d = _dist()
    rank, world = (d.get_rank(), d.get_world_size()) if d is not None else (0, 1)
    problems: list[str] = []
    committed = None
    try:
        committed = store.read_committed(url)
        if committed is not None:
            problems = store.verify_share(committed[0], committed[1], rank, world)
    except CheckpointError as e:
        problems = [e.problem]
    problems = _agree(problems)
    if problems:
        raise CheckpointError(url, problems[0])
    reader = _reader(url)
    try:
        keys = set(reader.read_metadata().state_dict_metadata)
    except FileNotFoundError:
        raise CheckpointError(
            url, f"file {DCP_METADATA} is missing (not a sharded checkpoint)"
        ) from None
    state_dict = state.state_dict()
    for key in [k for k in state_dict if k.startswith(RNG_PREFIX)]:
        if key not in keys or key != rng_key(rank):
            del state_dict[key]
    dcp_load(state_dict, storage_reader=reader, **_no_dist(dcp_load, d is None))
    state.load_state_dict(state_dict)
