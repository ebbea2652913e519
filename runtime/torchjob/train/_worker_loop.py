"""What every worker runs for one generation of ``TorchTrainer.fit``.

Where the ranks hold an in-memory restore point (the survivors of a lost rank,
``torchjob.train.recovery.restore_point``), a survivor broadcasts it and storage is not read.
Else rank 0 finds the latest committed checkpoint and reads it (verified); the other
ranks receive its files by broadcast, so only rank 0 needs storage access. Then
the user's ``train_func`` runs with a session that ``report`` and friends use.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import cloudpickle

from torchjob.checkpoint import (
    CheckpointError,
    CheckpointStorage,
    DataPosition,
    restore_rng,
    write_files,
)
from torchjob.checkpoint.sharded import is_sharded
from torchjob.launch import send_event, worker_info
from torchjob.launch.protocol import MirrorFallback, RestoredFromMemory, Run
from torchjob.train import _session, _shared_result
from torchjob.train._spec import WorkerOutcome, WorkerSpec
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.recovery import in_place, restore_point, shard_rebuild

_Payload = tuple[str, Any, Any, int | None]
"""(kind, files or path, data positions, the run's report number the checkpoint was taken at
when its manifest says)."""


def _load_resume(spec: WorkerSpec) -> _Payload:
    """On rank 0: ("ok", files, positions, report), ("sharded", path, positions, report),
    ("none", ...) or ("error", path, problem, None)."""
    try:
        if spec.storage_url:
            storage = CheckpointStorage(spec.storage_url)
            latest = storage.latest_committed()
            if latest is not None and is_sharded(latest):
                # Every rank reads its own shards (Checkpoint.load_state): rank 0 reads none.
                return ("sharded", latest.path, latest.data_positions, latest.report)
            if latest is not None:
                return ("ok", storage.read_files(latest), latest.data_positions, latest.report)
        if spec.resume_from and Checkpoint(spec.resume_from).is_sharded:
            return ("sharded", spec.resume_from, [], None)
        if spec.resume_from:
            tmp = Checkpoint(spec.resume_from).to_directory()
            try:
                from pathlib import Path

                files = {
                    p.relative_to(tmp).as_posix(): p.read_bytes()
                    for p in Path(tmp).rglob("*")
                    if p.is_file()
                }
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            return ("ok", files, [], None)
    except CheckpointError as e:
        return ("error", e.path, e.problem, None)
    return ("none", None, None, None)


def _reports_before(payload: _Payload, spec: WorkerSpec) -> int:
    """The run's reports before a generation that did not start from memory: those of the
    checkpoint it resumes from, where its manifest says (a driver new to the job, as when
    every pod was replaced, has seen none of them, and the job's status would say it
    started over); else the reports this driver has seen."""
    return payload[3] if payload[3] is not None else len(spec.history_before)


def _broadcast(payload: _Payload | None, world_size: int) -> _Payload:
    if world_size == 1:
        assert payload is not None
        return payload
    import torch.distributed as dist

    box: list[Any] = [payload]
    dist.broadcast_object_list(box, src=0)
    result: _Payload = box[0]
    return result


def _accepts_config(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return len(params) > 0


_LIVE: list[WorkerSpec | None] = [None]
"""The spec of the generation the running training function is in: a function re-formed in
place (:func:`resume`) goes on under the next generation's."""


def run_training(spec: WorkerSpec) -> WorkerOutcome:
    info = worker_info()
    assert info is not None, "run_training runs inside a torchjob worker"
    os.environ.update(spec.env)
    in_place.reset()
    _LIVE[0] = spec
    restored, mirrored, payload = _restore(spec, info)
    restored_dir, checkpoint, positions = _resumed(payload, info.rank)
    session = _session.Session(
        world_rank=info.rank,
        local_rank=info.local_rank,
        world_size=info.world_size,
        local_world_size=info.local_world_size,
        node_rank=info.node_rank,
        generation=info.generation,
        experiment_name=spec.experiment_name,
        run_path=spec.run_path,
        device=info.device,
        storage_url=spec.storage_url,
        num_to_keep=spec.num_to_keep,
        score_attribute=spec.score_attribute,
        score_order=spec.score_order,
        checkpoint=checkpoint,
        resume_positions=positions,
        async_commit=spec.async_commit and info.rank == 0,
        restored=restored,
        report_base=(
            restored.snapshot.index
            if restored is not None
            else mirrored.index
            if mirrored is not None
            else _reports_before(payload, spec)
        ),
        mirror_plan=mirrored,
        async_save=spec.async_commit,
        resume=resume,
        park_stopped=park_stopped,
    )
    _session.set_current(session)
    stopped = False
    shared = None
    try:
        try:
            if _accepts_config(spec.train_func):
                spec.train_func(dict(spec.config or {}))
            else:
                spec.train_func()
        except BaseException:
            with contextlib.suppress(Exception):
                session.drain()  # what was reported before the failure still lands
            raise
        session.drain()  # the run's checkpoints are committed before its result is built
        live = _LIVE[0] or spec  # the generation it ended in (it may have re-formed in place)
        if live.share_result:
            shared = _shared_result.share(live, session)
    except _session.StopTraining:
        stopped = True
    finally:
        _session.set_current(None)
        _LIVE[0] = None
        if restored_dir:
            shutil.rmtree(restored_dir, ignore_errors=True)
    info = worker_info() or info
    return WorkerOutcome(
        rank=info.rank,
        stopped=stopped,
        reports=session.reports,
        stopped_at_report=session.stopped_at_report,
        shared=shared,
    )


def resume(run: Run) -> bool:
    """The driver's next task for a training function parked in place
    (``recovery.in_place``): True when it is this generation's ``run_training`` and the ranks
    agreed that the parked go on in place (``in_place.decide``). Then the agreed restore point
    is loaded into the registered state (unless its live state is kept), DDP moves to the new
    group (its buckets laid out anew where a rank joins afresh), and the session takes the
    generation's ranks and numbers; the function goes on. False: the task is run afresh."""
    fn, args, _kwargs = cloudpickle.loads(run.payload)
    if fn is not run_training:
        return False
    spec: WorkerSpec = args[0]
    info = worker_info()
    s = _session.current()
    assert info is not None and s is not None and s.registered is not None
    os.environ.update(spec.env)
    registered = s.registered

    def retake(index: int) -> object:  # the live state, undone to report ``index``
        return restore_point.take(spec.run_path, index, registered, s.data_positions())

    note = s.parked_note
    agreed = in_place.agree_parked(spec.run_path, info.rank, info.world_size, note, retake)
    restored = agreed.restored
    if not agreed.stays or restored is None:
        return False
    if agreed.kept_at is None:  # roll back to the restore point, in the same objects
        restore_point.load_into(s.registered, restored.snapshot.state)
        restore_rng(restored.snapshot.rng)
    in_place.regroup(s.registered)
    if agreed.joined:  # a rank runs the function afresh and joins
        in_place.sync_buckets(s.registered)
    s.drain()  # a commit in flight lands before the session moves on
    _session.moved_to(s, info, restored, spec, kept_at=agreed.kept_at)
    _LIVE[0] = spec
    if info.rank == 0:
        _say_restored(restored, in_place=True, kept_at=agreed.kept_at)
    return True


def park_stopped(s: _session.Session) -> None:
    """A regroup's report on a rank whose state re-forms in place
    (``in_place.parks_at_regroup``): the task ends as a stop at this report would end it,
    its function parked in the report; returns into it inside the next generation."""
    from torchjob.launch import worker

    info = worker_info()
    assert info is not None and s.resume is not None
    outcome = WorkerOutcome(
        rank=info.rank, stopped=True, reports=s.reports, stopped_at_report=s.reports
    )
    worker.current().park_done(cloudpickle.dumps(outcome), s.resume)


def _say_restored(
    restored: restore_point.Restored, *, in_place: bool = False, kept_at: int | None = None
) -> None:
    """Rank 0 tells the driver the generation started from the survivors' memory."""
    snap = restored.snapshot
    send_event(
        RestoredFromMemory(
            index=snap.index,
            source_rank=restored.source_rank,
            seconds=restored.seconds,
            bytes=snap.nbytes,
            in_place=in_place,
            kept_at=kept_at,
        )
    )


def _restore(
    spec: WorkerSpec, info: Any
) -> tuple[restore_point.Restored | None, shard_rebuild.Plan | None, _Payload]:
    """Where this generation's state comes from: the survivors' memory first (the restore
    point, or the shard mirror for sharded state); storage only when no rank holds one."""
    restored = in_place.agree(spec.run_path, info.rank, info.world_size)
    mirrored: shard_rebuild.Plan | None = None
    if restored is None:  # sharded state: the shard mirror (register_state rebuilds it)
        agreed = shard_rebuild.agree(spec.run_path, info.rank, info.world_size)
        if isinstance(agreed, shard_rebuild.Fallback) and info.rank == 0:
            send_event(MirrorFallback(agreed.reason))
        mirrored = agreed if isinstance(agreed, shard_rebuild.Plan) else None
    if mirrored is not None:
        return restored, mirrored, ("memory", None, mirrored.positions, None)
    if restored is not None:
        if info.rank == 0:
            _say_restored(restored)
        return restored, None, ("memory", None, restored.snapshot.positions, None)
    payload = _broadcast(_load_resume(spec) if info.rank == 0 else None, info.world_size)
    return None, None, payload


def _resumed(
    payload: _Payload, rank: int
) -> tuple[str | None, Checkpoint | None, list[DataPosition]]:
    """The checkpoint the training function resumes from (its files written to a temporary
    directory when they came by broadcast) and the data positions."""
    if payload[0] == "error":
        raise CheckpointError(payload[1], payload[2])
    restored_dir: str | None = None
    checkpoint = None
    if payload[0] == "ok":
        restored_dir = tempfile.mkdtemp(prefix=f"torchjob-resume-r{rank}-")
        write_files(payload[1], restored_dir)
        checkpoint = Checkpoint(restored_dir)
    elif payload[0] == "sharded":
        checkpoint = Checkpoint(payload[1])
    if payload[0] not in ("ok", "sharded", "memory"):
        return restored_dir, checkpoint, []
    return restored_dir, checkpoint, [DataPosition.from_dict(p) for p in payload[2] or []]
