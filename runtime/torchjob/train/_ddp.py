"""DDP for a generation that resumes from the survivors' memory: no init broadcast.

Every rank of such a generation holds the same restore point (``restore_point.agree``) and
``register_state`` loads it into the model, so DDP's broadcast of every parameter from rank
0 at construction is redundant: 0.6-0.9 s of each re-formation for 84 MiB of parameters over
8 ranks on 2 cores, the model's size times its ranks at scale. :func:`wrap` builds DDP
without it (``init_sync=False``, or, where DDP has no ``init_sync``, as in Debian's torch 2.6
that the CPU image runs, with its module's broadcast stood down for the construction:
:func:`without_init_broadcast`). Should the loop never load the restore point into that
model (it is not in the registered state), its first forward broadcasts rank 0's parameters
and buffers then (:func:`_sync_before_first_forward`): the ranks never train from different
ones. Every rank decides alike: the restore point is agreed collectively, and loaded on all
ranks or on none.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from torchjob.train import _session
from torchjob.train.recovery import in_place


def wrap(model: torch.nn.Module, kwargs: dict[str, Any]) -> torch.nn.Module:
    """``model`` in DDP with the caller's ``kwargs``; without the init broadcast where the
    generation resumes from memory and the caller did not set ``init_sync``."""
    from torch.nn.parallel import DistributedDataParallel

    s = _session.current()
    if s is None or "init_sync" in kwargs:
        return DistributedDataParallel(model, **kwargs)
    if s.restored is None:
        ddp = DistributedDataParallel(model, **kwargs)
    else:
        if "init_sync" in inspect.signature(DistributedDataParallel.__init__).parameters:
            ddp = DistributedDataParallel(model, **kwargs, init_sync=False)
        else:
            # A rank joining a group that goes on in place checks no shapes with it either:
            # its peers, inside their training function, take no part (the restore point's
            # load checks them, against the same state).
            with without_init_broadcast(verify=not in_place.joining()):
                ddp = DistributedDataParallel(model, **kwargs)
        _sync_before_first_forward(ddp, s)
        s.unsynced.append(ddp)
    s.wrapped.append(ddp)
    return ddp


@contextlib.contextmanager
def without_init_broadcast(*, verify: bool = True) -> Iterator[None]:
    """DDP constructed meanwhile skips its broadcast of the module's state from rank 0 (a
    torch whose DDP has no ``init_sync``: its constructor calls its module's
    ``_sync_module_states``, and nothing else does). The parameters' shapes are still checked
    across the ranks, unless not ``verify`` (then the constructor runs no collective)."""
    from torch.nn.parallel import distributed

    names = ["_sync_module_states", *([] if verify else ["_verify_param_shape_across_processes"])]
    originals = {n: getattr(distributed, n) for n in names if hasattr(distributed, n)}
    for name in originals:
        setattr(distributed, name, _skip)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(distributed, name, original)


def _skip(*args: Any, **kwargs: Any) -> None:
    return None


def _sync_before_first_forward(ddp: Any, s: _session.Session) -> None:
    """At ``ddp``'s first forward, rank 0's parameters and buffers to every rank unless the
    restore point was loaded into it (``register_state`` took it off ``s.unsynced``)."""
    import torch.distributed as dist

    def once(module: Any, args: Any) -> None:
        handle.remove()
        if any(m is ddp for m in s.unsynced):
            s.unsynced[:] = [m for m in s.unsynced if m is not ddp]
            for t in ddp.module.state_dict().values():
                dist.broadcast(t, 0, group=ddp.process_group)

    handle = ddp.register_forward_pre_hook(once)


def loaded(registered: Mapping[str, Any], s: _session.Session) -> None:
    """The restore point was loaded into ``registered`` on every rank: its DDP models (or
    the modules they wrap) are equal everywhere, and need no broadcast."""
    values = [v for v in registered.values() if isinstance(v, torch.nn.Module)]
    s.unsynced[:] = [m for m in s.unsynced if not any(v is m or v is m.module for v in values)]
