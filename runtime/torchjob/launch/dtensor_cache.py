"""Forget DTensor's sharding-propagation caches when a process joins a new group.

DTensor caches the result of sharding propagation per operator and input specs (a Python
``lru_cache`` and, in newer torch, a C++ fast-path cache). The output specs it returns hold
the ``DeviceMesh`` of the call that filled the cache, and a ``DeviceMesh`` compares and hashes
by its shape and rank list only, not by this process's coordinate in it. A process that
re-forms in place and gets another rank (a survivor: rank 1 of two, then rank 0 of one, then
rank 0 of two beside a replacement) builds a new, correct mesh, but the first DTensor op on it
(``nn.Parameter(...)`` in ``fully_shard`` detaches) hits an entry of an earlier generation and
returns a spec whose mesh still says the old coordinate. Every shard then claims the wrong
offset: DCP's global plan fails ("invalid fill"), so that generation's sharded checkpoints are
never written, and anything else that reads ``get_coordinate()`` is wrong. Clearing the caches
when the group is formed costs one miss per operator in the new generation.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)
_WARNED: list[str] = []


def forget() -> None:
    """Clear DTensor's sharding-propagation caches (nothing to do before DTensor is imported)."""
    if "torch.distributed.tensor" not in sys.modules:
        return  # no DTensor op ran in this process: nothing cached
    import torch
    from torch.distributed.tensor import DTensor

    try:  # torch's private names: a torch that moved them must not stop the group forming
        cached = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
        # torch >= 2.7: LocalLRUCache.cache_clear(); torch 2.6: only its ``cache`` (an lru_cache).
        clear = getattr(cached, "cache_clear", None) or cached.cache.cache_clear
        clear()
    except AttributeError as exc:
        if not _WARNED:
            _WARNED.append(str(exc))
            log.warning(
                "torchjob: cannot clear DTensor's sharding cache on this torch (%s): a rank "
                "that changes in place may keep its old mesh coordinate",
                exc,
            )
    fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if fast_path is not None:  # the C++ dispatch fast path's own cache (newer torch)
        fast_path()
