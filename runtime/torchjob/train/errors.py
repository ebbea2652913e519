"""Errors ``TorchTrainer.fit`` raises. The message's first line is the root cause and its rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.train.result import Result


class TrainingFailedError(RuntimeError):
    """Training failed and the failure budget is spent (or the failure is not retryable).

    ``cause`` is the root-cause error (``WorkerGroupError``, ``WorkerDiedError``,
    ``CollectiveTimeoutError``...); ``result`` holds what was reached before.
    """

    def __init__(self, message: str, *, cause: BaseException | None, result: Result | None) -> None:
        super().__init__(message)
        self.cause = cause
        self.result = result


class TrainingStoppedError(RuntimeError):
    """Training stopped on request (SIGTERM, e.g. preemption) after committing a checkpoint."""

    def __init__(self, message: str, *, result: Result | None) -> None:
        super().__init__(message)
        self.result = result
