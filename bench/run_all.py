"""Run every ``bench/*.py`` benchmark in turn (``make bench``); each prints its own figures."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# Benchmarks with a make target of their own (they build and run a cluster for minutes).
OWN_TARGET = ("operator_vs_kubeflow.py", "goodput.py", "recovery_scale.py")


def main() -> int:
    here = Path(__file__).resolve().parent
    failed = []
    for script in sorted(here.glob("*.py")):
        if script.name in (Path(__file__).name, *OWN_TARGET) or script.name.startswith("_"):
            continue
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
