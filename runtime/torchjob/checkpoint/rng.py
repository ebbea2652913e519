"""One capture and restore of a process's random number generators, for every checkpoint that
keeps them: a sharded ``TrainState`` (pickled under ``rng_rank<N>``), a restore point and a
shard mirror's snapshot.

The states, as a plain dict: ``"python"`` (``random``), ``"torch"`` (the CPU generator),
``"numpy"`` when numpy is installed, and ``"cuda"`` (every device's generator) when CUDA is
initialised. A restore sets what the dict holds and leaves the rest: a state saved on a host
with more GPUs than this one is trimmed to this host's devices, and a numpy state is skipped
where numpy is missing. torch is imported on use, so ``torchjob.checkpoint`` stays light.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any


def capture_rng() -> dict[str, Any]:
    """This process's generator states."""
    import torch

    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy

        states["numpy"] = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: Mapping[str, Any]) -> None:
    """Set the generators to ``states`` (from :func:`capture_rng`, here or on another host)."""
    import torch

    if "python" in states:
        random.setstate(states["python"])
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "numpy" in states:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy ships with torch's wheels
            pass
        else:
            numpy.random.set_state(states["numpy"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(states["cuda"])[: torch.cuda.device_count()])
