"""Run the benchmarks without a make target of their own in turn (``make bench``); each prints
its own figures. The other modules of the package are the shared harness, the parts of the
larger benchmarks, and offline tools (``goodput_profile.py``, ``goodput_recompute.py``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# operator_vs_kubeflow.py, goodput.py and recovery_scale.py have a make target of their own
# (they build and run a cluster, or 64 ranks, for minutes).
BENCHMARKS = (
    "bench_trainer_vs_torchrun.py",
    "checkpoint_stall.py",
    "initializers.py",
    "object_store.py",
    "quickstart_vs_torchrun.py",
    "restore_point.py",
    "sharded_checkpoint.py",
    "store_connect.py",
)


def main() -> int:
    here = Path(__file__).resolve().parent
    failed = []
    for script in (here / name for name in BENCHMARKS):
        print(f"== {script.name}", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, str(script), *sys.argv[1:]])
        print(f"== {script.name}: exit {code} in {time.monotonic() - started:.1f}s\n", flush=True)
        if code:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
