"""What a trial's code calls: ``report``, ``distributed_checkpoint_dir``, ``is_distributed_trainable``.

Two places a trial's code can run:

* in the driver (a plain function trainable): ``report`` goes straight to the
  trial's :class:`Reporter`, which may raise :class:`TrialPruned` to stop it;
* in the worker processes of a distributed trial
  (:func:`torchjob.tune.DistributedTrainableCreator`): rank 0's reports travel
  to the driver as launcher events; the driver prunes by stopping the group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torchjob.launch import send_event, worker_info, worker_state
from torchjob.launch.protocol import TrialCheckpointed, TrialReported
from torchjob.rules.trial import trial_config

_WORKER_KEY = "torchjob.tune.trial"


class TrialStopped(Exception):
    """Raised from ``report`` in a trial's code when the trial met its stop criteria."""


class TrialPruned(TrialStopped):
    """Raised from ``report`` when the pruner stops the trial early."""


CONTINUE, STOP, PRUNE = "continue", "stop", "prune"


class Reporter:
    """Driver-side sink of one trial's reports; ``on_report`` decides continue, stop or prune."""

    def __init__(self, trial_dir: Path, on_report: Callable[[dict[str, Any]], str]) -> None:
        self.trial_dir = trial_dir
        self._on_report = on_report
        self.checkpoint: str | None = None
        """The latest checkpoint directory the trial wrote (``checkpoint_dir``)."""

    def report(self, metrics: Mapping[str, Any]) -> None:
        verdict = self._on_report(dict(metrics))
        if verdict == PRUNE:
            raise TrialPruned(f"trial pruned after {dict(metrics)}")
        if verdict == STOP:
            raise TrialStopped(f"trial met its stop criteria at {dict(metrics)}")


_LOCAL = threading.local()


def _set_reporter(reporter: Reporter | None) -> None:
    _LOCAL.reporter = reporter


def _reporter() -> Reporter | None:
    reporter: Reporter | None = getattr(_LOCAL, "reporter", None)
    return reporter


def _set_worker_trial(trial_dir: str) -> None:
    """Run on every worker of a distributed trial before the user's function."""
    worker_state()[_WORKER_KEY] = {"trial_dir": trial_dir}


def _worker_trial() -> dict[str, Any] | None:
    if worker_info() is None:
        return None
    trial: dict[str, Any] | None = worker_state().get(_WORKER_KEY)
    return trial


def report(metrics: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
    """Report a trial's metrics: ``report({"loss": 0.1})`` or ``report(loss=0.1)``.

    In a distributed trial only rank 0's reports count (every rank may call it).
    """
    merged = {**(dict(metrics) if metrics else {}), **kwargs}
    if _worker_trial() is not None:
        info = worker_info()
        if info is not None and info.rank == 0:
            send_event(TrialReported(merged))
        return
    reporter = _reporter()
    if reporter is None:
        raise RuntimeError("torchjob.tune.report() called outside a Tuner trial")
    reporter.report(merged)


def is_distributed_trainable() -> bool:
    """True inside the worker processes of a :func:`DistributedTrainableCreator` trial."""
    return _worker_trial() is not None


def get_trial_dir() -> str | None:
    """This trial's directory (under the run's storage path), or ``None`` outside a trial."""
    trial = _worker_trial()
    if trial is not None:
        return str(trial["trial_dir"])
    reporter = _reporter()
    return str(reporter.trial_dir) if reporter is not None else None


def _record_checkpoint(path: str) -> None:
    """Tell the trial's driver where its latest checkpoint is (rank 0 or the driver)."""
    if _worker_trial() is not None:
        send_event(TrialCheckpointed(path))
        return
    reporter = _reporter()
    if reporter is not None:
        reporter.checkpoint = path


@contextlib.contextmanager
def distributed_checkpoint_dir(step: int, disable: bool = False) -> Iterator[str]:
    """A directory to write a checkpoint in; only rank 0's is kept (seed 001).

    On rank 0 (or outside a distributed trial) it is ``<trial_dir>/checkpoint_<step>``;
    on other ranks a temporary directory deleted on exit, so the ranks of a trial
    never write the same checkpoint twice. The kept directory becomes the trial's
    ``Result.checkpoint`` (``analysis.best_checkpoint``) once the block exits.
    """
    info = worker_info()
    trial_dir = get_trial_dir()
    keep = not disable and trial_dir is not None and (info is None or info.rank == 0)
    if keep:
        assert trial_dir is not None
        path = Path(trial_dir) / f"checkpoint_{step:06d}"
        path.mkdir(parents=True, exist_ok=True)
        yield str(path)
        _record_checkpoint(str(path))
        return
    tmp = tempfile.mkdtemp(prefix="torchjob-ckpt-discard-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkpoint_dir(step: int) -> contextlib.AbstractContextManager[str]:
    """Ray Tune's ``with tune.checkpoint_dir(step=epoch) as d:`` (seed 001): write the
    trial's checkpoint in ``d``. The same directory as :func:`distributed_checkpoint_dir`,
    which it is in a distributed trial too (only rank 0's is kept)."""
    return distributed_checkpoint_dir(step)


def get_trial_config() -> dict[str, Any] | None:
    """In a trial's TorchJob (cluster backend): the trial's config; ``None`` elsewhere.

    A ``TorchTrainer`` there merges it into its ``train_loop_config`` by itself
    (``config["train_loop_config"]`` and the other top-level keys); other code reads it here.
    """
    return trial_config(os.environ)
