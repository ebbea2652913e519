"""The events file of bench/goodput.py's workloads, one definition for the three workers
(bench/_goodput_worker.py, bench/_goodput_fsdp_worker.py, bench/_goodput_torchrun.py).

Each worker takes ``T0 = time.time()`` on its first line, imports this module (the standard
library only, so T0 still precedes every heavy import) and writes ``start`` with
``t_start=T0`` before it imports torch. Every event is one JSON line appended to the events
file (a file on the storage every pod shares; O_APPEND, one short line per write):

    {"ev": ..., "t": wall clock, "pod": hostname, "gen": generation, "pid": ..., **fields}

``gen`` is ``TORCHJOB_GENERATION`` unless the worker sets ``Events.gen`` itself (Kubeflow's
PyTorchJob has no generation number: bench/_goodput_torchrun.py counts its groups).
bench/goodput.py and bench/goodput_profile.py read these lines.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path


class Events:
    """Appends the events of one process to PATH."""

    def __init__(self, path: str | Path, gen: int | None = None) -> None:
        self.path = Path(path)
        self.gen = gen

    def emit(self, ev: str, **fields: object) -> None:
        gen = self.gen if self.gen is not None else int(os.environ.get("TORCHJOB_GENERATION", "0"))
        line = {
            "ev": ev,
            "t": time.time(),
            "pod": socket.gethostname(),
            "gen": gen,
            "pid": os.getpid(),
            **fields,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
