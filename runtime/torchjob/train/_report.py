"""``report`` and ``get_checkpoint``: how a training function talks to the run.

``report`` is collective: every rank calls it at the same point. Rank 0 commits
the checkpoint to storage (only rank 0 needs storage access), then all ranks
all-reduce their stop flags. If any rank was asked to stop (SIGTERM, a resize),
every rank leaves at this same report, after the checkpoint is safe. A loop that asked
``should_stop()`` since its last report was answered by that all-reduce already: its
report makes none (one small all-reduce per step, not two, for the docs' loop).

With ``CheckpointConfig.async_commit`` (the default) rank 0 stages the checkpoint's
files by hard links and commits them on a background thread
(:class:`~torchjob.checkpoint.background.BackgroundCommitter`: the same atomic protocol,
one commit in flight), so a report costs the link, not the copy; the commit is
announced by a ``checkpoint`` event when it lands. A stop waits for it before the
group leaves, and so does the end of the generation.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchjob.checkpoint import CheckpointStorage, CommittedCheckpoint
from torchjob.launch import regroup_requested, send_event, stop_requested
from torchjob.launch.protocol import CheckpointLanded, Report
from torchjob.train import _session
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.recovery import (
    cadence,
    host_copy,
    in_place,
    preemption,
    restore_point,
    shard_mirror,
    step_undo,
)

if TYPE_CHECKING:
    from torchjob.checkpoint.background import BackgroundCommitter
    from torchjob.train.state import StateCheckpoint


def _summed(values: list[int]) -> list[int]:
    """Every rank's ``values``, summed over the group (one small all-reduce; the values as
    they are without a group of more than one)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    sums = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return [int(v) for v in sums.tolist()]


def _agree_to_stop(local_stop: bool) -> bool:
    return _summed([int(local_stop)])[0] > 0


def _agree(s: _session.Session, local_stop: bool) -> tuple[bool, bool]:
    """(stop, regroup): the stop flags of every rank, and in the same all-reduce what each
    read of its pod's notice (``preemption.digest``): only when that sum moved do the ranks
    gather the notices themselves, so ``get_preemption_info()`` costs no collective of its
    own at each step. The same all-reduce agrees on the restore point's cadence
    (``Cadence.agree``), and on a re-formation the driver asked for (``regroup_requested``:
    a generation that adds or drops a pod). That one ends the generation at this report
    without the loop's stop when every rank holds whole registered state and not every rank
    is under notice (:func:`_all_noticed`): the next generation resumes from the restore
    point, and the stop's checkpoint would be written for nothing (252 MiB: most of the
    2.3 s from the last step to the group's end at each re-formation of
    bench/results/2026-12-03b). Otherwise it is a stop like SIGTERM's."""
    local = preemption.read_local()
    vote = s.cadence.vote() if s.registered is not None else list(cadence.NO_VOTE)
    flags = [int(local_stop), int(regroup_requested()), int(_holds(s))]
    stops, regroups, holders, digests, *votes = _summed([*flags, preemption.digest(local), *vote])
    if digests != s.notice_digest:  # the same sum on every rank: every rank gathers
        s.notice = preemption.agree(local) if digests else None
        s.notice_digest = digests
        s.noticed |= frozenset(s.notice.ranks if s.notice is not None else ())
    s.cadence.agree(votes)  # one restore-point cadence for the group
    from_memory = regroups > 0 and holders >= s.world_size and not _all_noticed(s)
    return stops > 0 or (regroups > 0 and not from_memory), from_memory and stops == 0


def _all_noticed(s: _session.Session) -> bool:
    """Every rank of the group was given notice in this generation (``Session.noticed``): no
    pod of it may outlive the re-formation with its memory, so the regroup is a stop, and
    the loop writes its stop's checkpoint. bench/results/2026-12-05p: a hand-over that
    replaced all eight pods of a noticed node ended in place without it, and the next
    generation redid 8 steps from storage; 2026-12-07j: two nodes noticed 1.8 s apart, the
    first's leavers dropped from the notice as their time ran out, 5 steps redone."""
    return len(s.noticed) >= s.world_size


def _holds(s: _session.Session) -> bool:
    """Whether this rank's restore point can carry the next generation: whole state is
    registered (sharded state's shard mirror waits for the loop's checkpoint, as before)."""
    if s.registered is None:
        return False
    if s.whole_state is None:
        s.whole_state = not restore_point.is_sharded(restore_point.state_of(s.registered))
    return s.whole_state


def _landed(
    s: _session.Session, storage: CheckpointStorage
) -> Callable[[CommittedCheckpoint], None]:
    """Rank 0, after a background commit: retention, then the ``checkpoint`` event."""

    def landed(ckpt: CommittedCheckpoint) -> None:
        storage.apply_retention(
            s.num_to_keep, score_attribute=s.score_attribute, score_order=s.score_order
        )
        send_event(CheckpointLanded(path=ckpt.path, index=ckpt.index, generation=s.generation))

    return landed


def _committer(s: _session.Session) -> BackgroundCommitter:
    """Rank 0's background committer for this generation (created at its first checkpoint)."""
    from torchjob.checkpoint.background import BackgroundCommitter

    if s.committer is None:
        assert s.storage_url is not None
        storage = CheckpointStorage(s.storage_url)
        s.committer = BackgroundCommitter(storage, on_commit=_landed(s, storage))
    return s.committer


def _save_sharded(s: _session.Session, checkpoint: StateCheckpoint, metrics: dict[str, Any]) -> Any:
    """Every rank: write its shards (``torchjob.train._sharded``); rank 0 commits. Returns the
    committed checkpoint on rank 0 when it committed now, else None."""
    from torchjob.train._sharded import ShardedSaver

    assert s.storage_url is not None
    if s.sharded is None:
        s.sharded = ShardedSaver(s.storage_url, rank=s.world_rank, world_size=s.world_size)
        if s.world_rank == 0:
            s.sharded.on_commit = _landed(s, s.sharded.storage)
    s.state = checkpoint.state
    background = s.async_save
    committed = s.sharded.save(
        checkpoint.state,
        metrics=metrics,
        data_positions=s.data_positions(),
        background=background,
        report=s.report_base + s.reports,
    )
    if committed is not None:
        s.sharded.storage.apply_retention(
            s.num_to_keep, score_attribute=s.score_attribute, score_order=s.score_order
        )
    return committed


def _commit(s: _session.Session, checkpoint: Checkpoint, metrics: dict[str, Any]) -> Any:
    """Rank 0: commit ``checkpoint`` now (returns it) or hand it to the background (None)."""
    assert s.storage_url is not None
    number = s.report_base + s.reports  # the run's: a restore from storage resumes its count
    with checkpoint.as_directory() as local_dir:
        if s.async_commit:
            _committer(s).submit(
                local_dir, metrics=metrics, data_positions=s.data_positions(), report=number
            )
            return None
        storage = CheckpointStorage(s.storage_url)
        committed = storage.commit(
            local_dir, metrics=metrics, data_positions=s.data_positions(), report=number
        )
    storage.apply_retention(
        s.num_to_keep, score_attribute=s.score_attribute, score_order=s.score_order
    )
    return committed


def report(metrics: dict[str, Any], checkpoint: Checkpoint | StateCheckpoint | None = None) -> None:
    """Report ``metrics`` (rank 0's are kept) and optionally a checkpoint.

    A ``Checkpoint.from_directory(d)``: rank 0's is saved (whole files). A
    ``Checkpoint.from_state(state)``: collective, every rank passes one and writes its own
    shards (``torchjob.train.state``)."""
    s = _session.current()
    if s is None:
        raise RuntimeError("torchjob.train.report() must be called inside a training function")
    if _rolled_back(s):
        return
    s.reports += 1
    s.last_metrics = dict(metrics)
    s.history.append(dict(metrics))
    snapshot, live, sharded = _restore_point(s)
    if s.in_place and s.registered is not None and not sharded:
        step_undo.mark(s.run_path, s.report_base + s.reports, s.registered)
    committed = None
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        from torchjob.train.state import StateCheckpoint

        if not isinstance(checkpoint, StateCheckpoint):
            raise TypeError(
                "report(checkpoint=...) takes Checkpoint.from_directory(path) or "
                f"Checkpoint.from_state(state), got {type(checkpoint).__name__}"
            )
        saving = s.world_rank == 0 and bool(s.storage_url)
        if s.storage_url:
            committed = _save_sharded(s, checkpoint, metrics)
    else:
        saving = s.world_rank == 0 and checkpoint is not None and bool(s.storage_url)
        if saving:
            assert checkpoint is not None
            committed = _commit(s, checkpoint, metrics)
    mirror = shard_mirror.held(s.run_path) if sharded else None
    if s.world_rank == 0:
        send_event(
            Report(
                metrics=dict(metrics),
                checkpoint_path=committed.path if committed else None,
                checkpoint_index=committed.index if committed else None,
                checkpoint_pending=saving and committed is None,
                world_size=s.world_size,
                generation=s.generation,
                report=s.report_base + s.reports,
                restore_point=snapshot is not None or mirror is not None,
                restore_point_bytes=snapshot.nbytes if snapshot else _nbytes(mirror),
            )
        )
    agreed = _stop_and_regroup(s, sharded)
    if agreed is None:
        return  # re-formed in place: this report's step was rolled back
    stop, regroup = agreed
    if sharded and live is not None and s.mirror_on:
        # Sharded state: the shard mirror, after the all-reduce above (a rank lost before it
        # leaves every survivor with the previous report's records, consistently).
        shard_mirror.take(
            s.run_path,
            s.report_base + s.reports,
            live,
            s.data_positions(),
            rank=s.world_rank,
            world=s.world_size,
            generation=s.generation,
            group=_mirror_group(s),
        )
    if regroup and not stop and (snapshot is None or snapshot.index != s.report_base + s.reports):
        assert s.registered is not None  # the cadence skipped this report: hold it anyway
        restore_point.take(s.run_path, s.report_base + s.reports, s.registered, s.data_positions())
    if stop or regroup:
        s.drain()  # the stop's checkpoint is committed before the group leaves
        # ... and no rank leaves before it is: the next generation's rank 0 may be another
        # pod (status.members), which reads the latest committed checkpoint at once.
        _agree_to_stop(True)
        if regroup and not stop and in_place.parks_at_regroup(s):
            return  # the group re-formed under this report: the loop goes on in place
        s.stopped_at_report = s.reports
        raise _session.StopTraining()


def _rolled_back(s: _session.Session) -> bool:
    """This report belongs to a step that an in-place re-formation rolled back: the one
    after a ``should_stop()`` that re-formed, or this one, re-formed now (the group broke
    under the step: ``recovery.in_place``). It counts for nothing."""
    if s.void_report:
        s.void_report = False
        return True
    return in_place.parked(s, in_place.broken())


def _stop_and_regroup(s: _session.Session, sharded: bool) -> tuple[bool, bool] | None:
    """What the ranks agreed at this report: (stop, regroup); None where the group broke in
    the agreement and re-formed in place under it.

    A loop that asked should_stop() since the last report stops on its answer (a stop asked
    for in between waits for the next should_stop(), where the loop saves its checkpoint),
    and that answer's all-reduce agreed the notices and the cadence too: no second one per
    step. Otherwise (and always for the shard mirror, which relies on this point) report
    agrees itself."""
    if s.stop_polled is not None and not sharded:
        agreed = s.stop_polled, s.regroup_polled
    else:
        try:
            both = _agree(s, stop_requested())
        except Exception as exc:
            if in_place.parked(s, exc):
                return None
            raise
        agreed = both if s.stop_polled is None else (s.stop_polled, s.regroup_polled)
    s.stop_polled, s.regroup_polled = None, False
    return agreed


def _restore_point(
    s: _session.Session,
) -> tuple[restore_point.Snapshot | None, dict[str, Any] | None, bool]:
    """The restore point of this report: (the snapshot held after it, the live state, whether
    it is sharded). Whole state: copied into host memory before the next collective (a
    peer lost in it leaves every survivor holding this report, or a survivor one report
    behind, which ``restore_point.agree`` sends the newest), at the session's cadence
    (``recovery.cadence``: between two copies the previous one stays held). Sharded state:
    the shard mirror's, after that collective."""
    if s.registered is None:
        return None, None, False
    live = restore_point.state_of(s.registered)
    s.whole_state = not restore_point.is_sharded(live)
    if not s.whole_state:
        restore_point.drop()
        return None, live, True
    s.cadence.waited(host_copy.waited())  # the last copy's overlapped part, where it showed
    s.cadence.beside(host_copy.cpu_beside())  # and the CPU it took beside the step
    if not s.cadence.due(time.monotonic(), s.reports, time.process_time()):
        return restore_point.held(), live, False
    t0 = time.monotonic()
    snapshot = restore_point.take(
        s.run_path,
        s.report_base + s.reports,
        s.registered,
        s.data_positions(),
        live,
        overlap=s.restore_point_overlap,
    )
    took_s, nbytes = time.monotonic() - t0, snapshot.nbytes if snapshot else 0
    # A first copy (or one whose state changed shapes) allocated its buffers: no sample.
    s.cadence.took(took_s, nbytes, snapshot.allocated if snapshot else True)
    news = s.cadence.news(in_place=s.in_place)
    if news is not None and s.world_rank == 0:
        print(f"[torchjob] {news}", file=sys.stderr, flush=True)
    return snapshot, live, False


def _nbytes(mirror: shard_mirror.Holding | None) -> int:
    return mirror.nbytes if mirror is not None else 0


def _mirror_group(s: _session.Session) -> Any:
    """The group the shard mirror exchanges on: the default one when it is gloo, else a gloo
    group of the generation's ranks (created at the first use, on every rank)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_backend() == "gloo":
        return None
    if s.mirror_group is None:
        s.mirror_group = dist.new_group(backend="gloo")
    return s.mirror_group


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from (latest committed), on every rank; ``None`` on a fresh start."""
    s = _session.current()
    return s.checkpoint if s is not None else None


def should_stop() -> bool:
    """Collective: True on every rank once any rank was asked to stop. For loops that report
    rarely, or that checkpoint when it says so: the next ``report()`` stops on this answer (a
    stop asked for after it is answered by the next ``should_stop()``), so the report that
    ends the run is the one the loop gave its checkpoint."""
    s = _session.current()
    if s is None:
        return _agree_to_stop(stop_requested())
    try:
        if in_place.parked(s, in_place.broken()):
            # The loop's report of this step: rolled back, or undone (``step_undo``).
            s.void_report = s.rolled_back or s.parked_note.undone
            return False
        stop, regroup = _agree(s, stop_requested())
    except Exception as exc:
        # The loss met here, not in the step's all-reduce: the step was whole on this rank.
        whole_at = None if in_place.broken() else s.report_base + s.reports
        if in_place.parked(s, exc, whole_at=whole_at):
            s.void_report = s.rolled_back
            return False
        raise
    s.stop_polled = stop or bool(s.stop_polled)
    s.regroup_polled = regroup or s.regroup_polled
    return stop


def get_preemption_info() -> preemption.PreemptionInfo | None:
    """Members of this run that will leave, and the deadline, or None.

    Like Ray Train's: call it on every rank the same number of times (it is a collective,
    so that every rank takes the same branch). A notice comes from the operator: a pod
    evicted with a grace period, or a node with a termination notice (docs/operations.md);
    the recommended answer is a checkpoint (``torchjob.train.report(..., checkpoint=...)``)
    and to train on. With ``replaceBeforeLeaving`` the group re-forms without those ranks at
    a report, with their replacements in their places, before the deadline.

    Inside a training function the answer is the one agreed at the last ``report()`` or
    ``should_stop()`` of this generation (their all-reduce carries the notices' digest), so
    a loop that asks every step makes no extra collective; a notice written after that
    point is seen at the next. Before the first of them it agrees on its own, except in the
    step an in-place re-formation rolled back (``recovery.in_place``: between the
    ``should_stop()`` it re-formed in and the void ``report()``), where a rank that joined the
    group afresh is already in its first step, and the answer is None."""
    s = _session.current()
    if s is not None and (s.notice_digest is not None or s.void_report):
        return s.notice
    return preemption.agree(preemption.read_local())
