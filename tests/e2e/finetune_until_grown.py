"""examples/finetune_fsdp/train.py as the real-node test runs it: its own ``main`` and
``train_func``, except that ``--step-seconds`` holds only until the job has grown back.

    FINETUNE_DIR=examples/finetune_fsdp python tests/e2e/finetune_until_grown.py ARGS...

The test evicts a pod, watches the job shrink to 1 rank and grow back to 2, resharding at each
step, and needs the growth to come before the last step: the slow step gives the replacement
time to start (over 90 s on a loaded CI host). Once a generation resumes from a checkpoint at
``--workers`` ranks, there is nothing left to wait for, so its steps run at full speed (the
fixed 0.2 s steps cost the test 180 s, most of it after the growth).
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.environ["FINETUNE_DIR"])

import train as example  # the example, on the path just above

GROWN_TO = int(os.environ.get("FINETUNE_GROWN_TO", "2"))

_original = example.train_func


def train_func(config: dict[str, Any]) -> None:
    grown = example.train.get_checkpoint() is not None
    if grown and example.train.get_context().get_world_size() >= GROWN_TO:
        config = {**config, "step_seconds": 0.0}
    _original(config)


if __name__ == "__main__":
    example.train_func = train_func  # main() hands the example's global to TorchTrainer
    example.main()
