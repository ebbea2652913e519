"""Ray Tune's callback interface (``tune.Callback``, ``tune.logger.LoggerCallback``), shared by
``tune.run`` / ``Tuner`` and ``TorchTrainer`` (``RunConfig(callbacks=[...])``).

The hook names and arguments are Ray's: ``setup``, ``on_trial_start``, ``on_trial_result``,
``on_checkpoint``, ``on_trial_complete``, ``on_trial_error``, ``on_experiment_end``, each with
``iteration`` (results seen so far), ``trials`` and ``trial`` (a :class:`TrialInfo`). A
``TorchTrainer`` run is one trial, as a Ray Trainer is one Tune trial: its callbacks run in the
driver of the pod that runs rank 0 (on a laptop: the ``fit()`` process), never in a worker.

A callback that raises is logged and skipped (:class:`Callbacks`): experiment tracking never
ends a training run.

It also holds what every logger callback (MLflow, TensorBoard, W&B) shares: the numbers of a
report (:func:`numeric_metrics`), a config as flat parameters (:func:`flat_params`) and
:class:`TrackingError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("torchjob.tracking")

_MAX_PARAM = 6000
"""The longest parameter value MLflow keeps."""


class TrackingError(RuntimeError):
    """The tracking backend cannot be used; the message names its URI."""


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": "1"}``, values as MLflow keeps them (<= 6000 chars)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}/"))
        else:
            out[name] = str(value)[:_MAX_PARAM]
    return out


def numeric_metrics(result: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a report (nested dicts flattened with ``/``); strings, bools and the
    rest are left out."""
    out: dict[str, float] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(numeric_metrics(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


@dataclass(eq=False)
class TrialInfo:
    """One trial as the callbacks see it (Ray's ``Trial`` attribute names)."""

    trial_id: str
    config: dict[str, Any] = field(default_factory=dict)
    local_path: str | None = None
    """A local directory for the trial's files (TensorBoard event files), or None."""
    trial_name: str = ""
    tracking: dict[str, Any] = field(default_factory=dict)
    """What a tracking callback resumes (``{"mlflow_run_id": ...}``, from ``status.tracking``)
    and what it opened (the run ids it sets here are published in the TorchJob's status)."""

    def __post_init__(self) -> None:
        self.trial_name = self.trial_name or self.trial_id

    @property
    def logdir(self) -> str | None:
        return self.local_path

    def __str__(self) -> str:
        return self.trial_name


class Callback:
    """Ray Tune's ``Callback``: override the hooks you need; every hook does nothing here."""

    def setup(self, stop: Any = None, num_samples: int | None = None, **info: Any) -> None:
        """Once, before the first trial starts."""

    def on_trial_start(
        self, iteration: int, trials: list[TrialInfo], trial: TrialInfo, **info: Any
    ) -> None: ...

    def on_trial_result(
        self,
        iteration: int,
        trials: list[TrialInfo],
        trial: TrialInfo,
        result: dict[str, Any],
        **info: Any,
    ) -> None: ...

    def on_checkpoint(
        self,
        iteration: int,
        trials: list[TrialInfo],
        trial: TrialInfo,
        checkpoint: Any,
        **info: Any,
    ) -> None:
        """``checkpoint`` has ``.path``: the committed checkpoint's URI."""

    def on_trial_complete(
        self, iteration: int, trials: list[TrialInfo], trial: TrialInfo, **info: Any
    ) -> None: ...

    def on_trial_error(
        self, iteration: int, trials: list[TrialInfo], trial: TrialInfo, **info: Any
    ) -> None: ...

    def on_experiment_end(self, trials: list[TrialInfo], **info: Any) -> None: ...


class LoggerCallback(Callback):
    """Ray's ``LoggerCallback``: the trial hooks as ``log_trial_start`` / ``log_trial_result`` /
    ``log_trial_save`` / ``log_trial_end(trial, failed)``."""

    def log_trial_start(self, trial: TrialInfo) -> None: ...

    def log_trial_result(
        self, iteration: int, trial: TrialInfo, result: dict[str, Any]
    ) -> None: ...

    def log_trial_save(self, trial: TrialInfo, checkpoint: Any = None) -> None: ...

    def log_trial_end(self, trial: TrialInfo, failed: bool = False) -> None: ...

    def on_trial_start(
        self, iteration: int, trials: list[TrialInfo], trial: TrialInfo, **info: Any
    ) -> None:
        self.log_trial_start(trial)

    def on_trial_result(
        self,
        iteration: int,
        trials: list[TrialInfo],
        trial: TrialInfo,
        result: dict[str, Any],
        **info: Any,
    ) -> None:
        self.log_trial_result(iteration, trial, result)

    def on_checkpoint(
        self,
        iteration: int,
        trials: list[TrialInfo],
        trial: TrialInfo,
        checkpoint: Any,
        **info: Any,
    ) -> None:
        self.log_trial_save(trial, checkpoint)

    def on_trial_complete(
        self, iteration: int, trials: list[TrialInfo], trial: TrialInfo, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=False)

    def on_trial_error(
        self, iteration: int, trials: list[TrialInfo], trial: TrialInfo, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=True)


class Callbacks:
    """Calls every callback's hook in order, one hook at a time (trials may run in threads); a
    callback that raises is logged, once per callback and hook, and the run goes on."""

    def __init__(self, callbacks: list[Any] | None) -> None:
        self.callbacks = list(callbacks or [])
        self.trials: list[TrialInfo] = []
        self.iteration = 0
        self._lock = threading.RLock()
        self._warned: set[tuple[int, str]] = set()

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def call(self, hook: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            for cb in self.callbacks:
                method = getattr(cb, hook, None)
                if method is None:
                    continue
                try:
                    method(*args, **kwargs)
                except Exception as exc:
                    key = (id(cb), hook)
                    if key not in self._warned:
                        self._warned.add(key)
                        log.error("torchjob: %s.%s failed: %s", type(cb).__name__, hook, exc)

    # --- the hooks, with Ray's arguments ---------------------------------------------------
    def setup(self, **info: Any) -> None:
        self.call("setup", **info)

    def trial_start(self, trial: TrialInfo) -> None:
        with self._lock:
            if trial not in self.trials:
                self.trials.append(trial)
            self.call("on_trial_start", self.iteration, self.trials, trial)

    def trial_result(self, trial: TrialInfo, result: dict[str, Any]) -> None:
        with self._lock:
            self.iteration += 1
            self.call("on_trial_result", self.iteration, self.trials, trial, result=result)

    def checkpoint(self, trial: TrialInfo, checkpoint: Any) -> None:
        self.call("on_checkpoint", self.iteration, self.trials, trial, checkpoint=checkpoint)

    def trial_end(self, trial: TrialInfo, *, failed: bool) -> None:
        hook = "on_trial_error" if failed else "on_trial_complete"
        self.call(hook, self.iteration, self.trials, trial)

    def experiment_end(self) -> None:
        self.call("on_experiment_end", self.trials)
