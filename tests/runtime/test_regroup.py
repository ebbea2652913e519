"""A re-formation ends the generation at a report without the loop's stop.

A KeepSurvivors pod's driver sends its workers ``REGROUP_SIGNAL`` when the operator publishes
a generation that adds or drops a pod (``torchjob.train.generation``). Every rank holds its
restore point, from which the next generation resumes, so ``should_stop()`` answers False:
the docs' loop writes no stop's checkpoint (252 MiB per re-formation on the fleet bench), and
the report holds the restore point of that very report, whatever the cadence. A rank whose
state cannot carry the next generation (none registered) makes it a stop like SIGTERM's, and
the loop checkpoints as before; so does a group whose every rank is under notice (no pod of it
outlives the re-formation with its memory), even where the notice shrank before the
re-formation (the operator drops a leaver whose time ran out). Real gloo workers; a rank sends the signal to
itself, as the pod's driver sends it to its workers.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torchjob.train
from torchjob.checkpoint import CheckpointStorage
from torchjob.launch import REGROUP_SIGNAL
from torchjob.train import Checkpoint, RunConfig, ScalingConfig
from torchjob.train.errors import TrainingStoppedError
from torchjob.train.recovery import preemption, restore_point
from torchjob.train.torch import TorchTrainer, prepare_model

WORLD = 2
ASK_AT = 3
"""The step after which world rank 1 is asked (its loop then asks ``should_stop()``)."""
SPOT = "aws-node-termination-handler/spot-itn"


def write_notice(path: Path, ranks: tuple[int, ...]) -> None:
    """A pod's notice file as its driver writes it: ``ranks`` leave in 120 s."""
    deadline = datetime.now(timezone.utc) + timedelta(seconds=120)
    pods = tuple(f"j-worker-{r}" for r in ranks)
    info = preemption.PreemptionInfo(deadline, ranks=ranks, pods=pods, reasons=(SPOT,) * len(ranks))
    path.write_text(json.dumps(info.to_json()))


def loop(config: dict[str, Any]) -> None:
    rank = torchjob.train.get_context().get_world_rank()
    if config["notice"]:  # this rank's pod's notice file, as its driver writes it
        preemption._reader = preemption.NoticeReader(Path(config["notice"]))
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state: dict[str, Any] = {"model": model, "optimizer": opt, "step": 0}
    if config["register"]:
        torchjob.train.register_state(state)
    checkpointed: list[int] = []
    try:
        while state["step"] < 50:
            step = state["step"] + 1
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            state["step"] = step
            if step == ASK_AT and rank == 1:
                os.kill(os.getpid(), config["signal"])
            stop = torchjob.train.should_stop()  # the docs' loop: a checkpoint on a stop
            ckpt = None
            if stop:
                d = tempfile.mkdtemp()
                torch.save({"step": step}, os.path.join(d, "state.pt"))
                ckpt = Checkpoint.from_directory(d)
                checkpointed.append(step)
            torchjob.train.report({"step": step}, checkpoint=ckpt)
            if stop:
                return
            if step == 1 and config["shrink"]:  # rank 0's leaver dropped: only rank 1 leaves
                if rank == 0:
                    write_notice(Path(config["notice"]), (1,))
                dist.barrier()
    finally:
        held = restore_point.held()
        Path(config["dir"], f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "ended": state["step"],
                    "checkpointed": checkpointed,
                    "held": held.index if held is not None else None,
                }
            )
        )


@pytest.mark.parametrize(
    ("sig", "register", "every", "noticed", "checkpoints"),
    [
        pytest.param(REGROUP_SIGNAL, True, None, False, False, id="regroup"),
        # The cadence would skip report 3 (reports 1, 5, 9): the regroup holds it anyway.
        pytest.param(REGROUP_SIGNAL, True, "4", False, False, id="regroup-between-restore-points"),
        pytest.param(signal.SIGTERM, True, None, False, True, id="sigterm-stops"),
        pytest.param(REGROUP_SIGNAL, False, None, False, True, id="regroup-without-state-stops"),
        pytest.param(REGROUP_SIGNAL, True, None, True, True, id="regroup-all-noticed-stops"),
        # Both ranks noticed at step 1, then rank 0 dropped from the notice (its time ran
        # out, bench/results/2026-12-07j): it leaves still, so the regroup is a stop.
        pytest.param(REGROUP_SIGNAL, True, None, "shrinks", True, id="regroup-notice-shrank-stops"),
    ],
)
def test_a_regroup_ends_at_the_next_report_holding_it_without_the_loops_checkpoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sig: int,
    register: bool,
    every: str | None,
    noticed: bool | str,
    checkpoints: bool,
) -> None:
    if every is not None:
        monkeypatch.setenv("TORCHJOB_RESTORE_POINT_EVERY", every)
    notice = ""
    if noticed:  # both ranks' pods on a node under notice (one file: the same for both)
        notice = str(tmp_path / "notice.json")
        write_notice(Path(notice), (0, 1))
    storage = tmp_path / "runs"
    trainer = TorchTrainer(
        loop,
        train_loop_config={
            "dir": str(tmp_path),
            "signal": int(sig),
            "register": register,
            "notice": notice,
            "shrink": noticed == "shrinks",
        },
        scaling_config=ScalingConfig(num_workers=WORLD),
        run_config=RunConfig(name="regroup", storage_path=str(storage)),
        torch_config=torchjob.train.TorchConfig(timeout_s=60),
    )
    # On a laptop nothing re-forms a group the driver did not resize: the run stops there.
    with pytest.raises(TrainingStoppedError) as stopped:
        trainer.fit()
    assert f"at report {ASK_AT}" in str(stopped.value), stopped.value
    ended = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [e["ended"] for e in ended] == [ASK_AT] * WORLD, ended
    assert [e["checkpointed"] for e in ended] == [[ASK_AT] if checkpoints else []] * WORLD
    assert [e["held"] for e in ended] == [ASK_AT if register else None] * WORLD, ended
    committed = CheckpointStorage(str(storage / "regroup")).latest_committed()
    assert (committed is not None) == checkpoints, committed
