"""The vocabulary of ``TorchTrainer.fit()``'s state machine, shared by its modes and its
controller: the *steps* (:data:`Step`), how a generation ended (:data:`GenerationEnd`), and
what a mode and the controller read of each other and of the trainer (:class:`FitContext`,
:class:`TrainerSettings`). Values and protocols only: no behaviour, so ``modes`` and
``controller`` both import it and never each other's caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torchjob.contract import PodEnv
from torchjob.launch import LaunchError
from torchjob.launch.policy import Resize, RestartGroup, RunState
from torchjob.train._spec import WorkerOutcome
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import RunConfig, ScalingConfig, TorchConfig

# --- steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """Form a worker group for ``state``'s generation and run the training function."""

    state: RunState


@dataclass(frozen=True)
class Restarting:
    """Local: the failure policy starts the next generation (same size, or one smaller)."""

    state: RunState
    decision: RestartGroup


@dataclass(frozen=True)
class Resizing:
    """Local elastic: every rank stopped at a report so the group can change size."""

    state: RunState
    resize: Resize


@dataclass(frozen=True)
class Following:
    """KeepSurvivors: wait for the operator's next generation, then run it in this pod.

    ``err`` is what broke the group, when something did: if no generation comes, the run
    ends with it; without one (the group stopped at a report) it ends as stopped or failed.
    """

    state: RunState
    why: str
    err: LaunchError | None = None


@dataclass(frozen=True)
class Reforming:
    """KeepSurvivors: a member of this generation is not up yet (a replacement still
    scheduling): form the same generation again."""

    state: RunState
    why: str


@dataclass(frozen=True)
class Finished:
    """Every rank returned: ``fit`` returns the Result."""

    outcomes: list[WorkerOutcome]


@dataclass(frozen=True)
class Stopped:
    """This process was asked to stop (SIGTERM): every rank stopped at one report."""

    at_report: int | None


@dataclass(frozen=True)
class Errored:
    """The run ends with ``err`` (``message`` says why it was not retried)."""

    err: BaseException
    message: str


Step = Running | Restarting | Resizing | Following | Reforming | Finished | Stopped | Errored


# --- how a generation ended --------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    outcomes: list[WorkerOutcome]


@dataclass(frozen=True)
class Interrupted:
    """Every rank stopped at a report: this process's SIGTERM, a resize, a new generation
    published, or a peer pod stopping the group."""

    outcomes: list[WorkerOutcome]


@dataclass(frozen=True)
class Crashed:
    err: LaunchError
    survivors_hold_state: bool = False
    """Some workers live on, kept for an in-place re-formation, holding the restore point."""


GenerationEnd = Completed | Interrupted | Crashed


class FitContext(Protocol):
    """What a mode reads of the running ``fit`` (the controller)."""

    @property
    def stop_requested(self) -> threading.Event:
        """Set by SIGTERM: stop every rank at its next report."""

    @property
    def pod(self) -> PodEnv | None:
        """This pod's env contract; ``None`` on a laptop."""


class TrainerSettings(Protocol):
    """What the controller reads of a ``TorchTrainer`` (``trainer.py`` imports the
    controller, so the controller names the trainer by this shape)."""

    @property
    def train_loop_per_worker(self) -> Callable[..., Any]: ...

    @property
    def train_loop_config(self) -> dict[str, Any] | None: ...

    @property
    def scaling_config(self) -> ScalingConfig: ...

    @property
    def run_config(self) -> RunConfig: ...

    @property
    def torch_config(self) -> TorchConfig: ...

    @property
    def resume_from_checkpoint(self) -> Checkpoint | None: ...
