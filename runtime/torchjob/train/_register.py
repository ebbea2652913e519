"""``register_state``: a training function hands the runtime its state (the restore point,
the shard mirror, re-forming in place)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import MutableMapping
from typing import Any

from torchjob.checkpoint import restore_rng
from torchjob.launch import send_event
from torchjob.launch.protocol import RestoredFromMirror
from torchjob.launch.settings import RuntimeSettings
from torchjob.train import _session
from torchjob.train._report import _mirror_group
from torchjob.train.recovery import in_place as regroup_in_place
from torchjob.train.recovery import restore_point, shard_mirror
from torchjob.train.recovery.cadence import Cadence


def register_state(
    state: MutableMapping[str, Any] | Any, *, mirror: bool | None = None, in_place: bool = False
) -> bool:
    """Hand the runtime this training function's state, as a dict of named entries: objects
    with ``state_dict()``/``load_state_dict()`` (the model, the optimizer, a scheduler) and
    plain values (the step, the epoch); or one such object (a ``TrainState``). Every ``report()`` from now on copies it into host
    memory: the restore point the group falls back on when a rank is lost. The RNG states and
    the prepared loaders' data positions are held with it.

    Where the group holds a restore point (the survivors of a lost rank re-formed in place),
    it is loaded into ``state`` now (``load_state_dict`` for objects, plain values replaced
    in the dict), the RNG states and data positions with it, and this returns True; then
    ``get_checkpoint()`` is None (storage was not read). False: nothing in memory, resume
    from ``get_checkpoint()`` as usual. Call it on every rank, once, after the model and the
    optimizer exist and before the first step.

    Sharded state (FSDP2 ``DTensor``s) is held by the shard mirror
    (``torchjob.train.recovery.shard_mirror``: each rank's shard in its own and in a ring neighbour's
    host memory, two shards of RAM per rank): after a loss the survivors rebuild the state at
    the new world size from it, collectively, here. ``mirror=False`` (or
    ``TORCHJOB_SHARD_MIRROR=0``) holds nothing for sharded state: a loss resumes from storage.

    ``in_place=True`` (whole state, DDP over gloo): after a peer's loss the survivors go on
    inside this training function, which is not run again: ``should_stop()`` or
    ``report()`` waits there for the next generation, the state is rolled back to the
    restore point in the same objects, DDP moves to the new group, and the call returns
    (``torchjob.train.recovery.in_place``). The loop must then read its counters from
    ``state`` at each step, and its world size from ``get_context()``. A group that takes a
    new rank (a replacement, a grow) goes on in place too where the models were built by
    ``prepare_model``: the new rank runs the function, and joins the others here."""
    s = _session.current()
    if s is None:
        raise RuntimeError("register_state() must be called inside a training function")
    registered = state if isinstance(state, MutableMapping) else {"state": state}
    if not isinstance(state, MutableMapping) and not callable(getattr(state, "state_dict", None)):
        raise TypeError(
            "register_state(state): state must be a dict of named entries or an object with "
            f"state_dict()/load_state_dict() (a TrainState), got {type(state).__name__}"
        )
    s.registered = registered
    s.mirror_on = shard_mirror.enabled(mirror)
    s.in_place = in_place and _in_place_ok(registered)
    settings = RuntimeSettings.from_env()
    s.cadence = Cadence(settings.restore_point_budget, settings.restore_point_every)
    s.restore_point_overlap = settings.restore_point_overlap
    if s.mirror_plan is not None:
        from torchjob.train.recovery import shard_rebuild

        done = shard_rebuild.restore(
            registered, s.mirror_plan, s.run_path, s.world_rank, s.world_size, _mirror_group(s)
        )
        if s.world_rank == 0:
            send_event(RestoredFromMirror(**dataclasses.asdict(done)))
        return True
    if s.restored is None:
        return False
    restore_point.load_into(registered, s.restored.snapshot.state)
    restore_rng(s.restored.snapshot.rng)
    from torchjob.train._ddp import loaded

    loaded(registered, s)  # DDP built without its init broadcast needs none now
    if regroup_in_place.joining():  # its peers went on in place: their buckets and this one's alike
        regroup_in_place.sync_buckets(registered)
    return True


def _in_place_ok(registered: MutableMapping[str, Any]) -> bool:
    """``register_state(in_place=True)``: DDP's all-reduce goes through the in-place comm hook
    (False, with a warning, where the group cannot re-form in place: sharded state, NCCL)."""
    if restore_point.is_sharded(restore_point.state_of(registered)):
        print(
            "[torchjob] register_state(in_place=True) is ignored: sharded state re-forms "
            "through the shard mirror",
            file=sys.stderr,
            flush=True,
        )
        return False
    return regroup_in_place.install(registered)
