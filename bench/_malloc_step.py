"""One side of bench/malloc_tuning.py: the goodput workload's step (bench/_goodput_state.py:
N MiB of Linear layers and Adam, one thread) in one process, after the worker's malloc
tuning (torchjob.launch.malloc, as TORCHJOB_MALLOC_TUNING says). Prints one JSON line:
per-step wall seconds and minor page faults, and the peak resident set.

    python bench/_malloc_step.py STATE_MIB STEPS
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import torch

import _goodput_state
from torchjob.launch import malloc
from torchjob.launch.settings import RuntimeSettings


def main() -> None:
    mib, steps = int(sys.argv[1]), int(sys.argv[2])
    chosen = malloc.tune(os.environ, enabled=RuntimeSettings.from_env().malloc_tuning)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = _goodput_state.build(mib, 1)
    opt = _goodput_state.optimizer(mib, model.parameters())
    seconds, faults = [], []
    for _ in range(steps):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        seconds.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(
        json.dumps(
            {
                "tuned": bool(chosen.calls),
                "why": chosen.reason,
                "torch": torch.__version__,
                "seconds": seconds,
                "faults": faults,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
