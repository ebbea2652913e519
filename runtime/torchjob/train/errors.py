"""Errors ``TorchTrainer.fit`` raises. The message's first line is the root cause and its rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchjob.contract import STOPPED_EXIT_CODE

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


class TrainingStoppedError(SystemExit, RuntimeError):
    """Training stopped on request (SIGTERM: a preemption, a drain, the job's deletion) after
    committing a checkpoint.

    A ``SystemExit`` whose ``code`` is ``contract.STOPPED_EXIT_CODE``: left uncaught in the
    user's script, the interpreter exits with that code and prints no traceback (the runtime
    has said so in one line), and every launcher reads the code as "stopped as asked", never a
    failure (``torchjob.rules.loss.Stopped``). Still a ``RuntimeError``, so code that catches
    it, or ``Exception``, as before keeps doing so. *Why a SystemExit:* the exit code is the
    contract with the operator and ``torchjob run``, and this is the one way a library error
    can end a script with a code of its choosing without a hook in the interpreter
    (``sys.excepthook``, ``atexit``) or a ``sys.exit`` the user must write.
    """

    def __init__(self, message: str, *, result: Result | None) -> None:
        super().__init__(message)
        self.code = STOPPED_EXIT_CODE
        self.result = result
