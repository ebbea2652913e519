"""``PyTorchTrainer``: RaySGD's creator API on torchjob's local worker group.

The driver keeps no model: each of ``num_replicas`` worker processes
(:class:`torchjob.launch.WorkerGroup`) builds its replica from the creator
functions once (:mod:`torchjob.sgd.runner`), and every ``train()`` /
``validate()`` call runs one pass on all of them and aggregates their stats.
Fault tolerance follows seed 002: with ``checkpoint="auto"`` the state of
rank 0 is snapshotted before each pass; when a worker dies the whole group is
restarted, restored from the snapshot, and the pass retried, up to
``max_retries`` times.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchjob.launch import (
    CollectiveTimeoutError,
    WorkerDiedError,
    WorkerGroup,
    WorkerGroupStartError,
)
from torchjob.rules import Counters, Failure, Loss, RestartRules, classify, decide_restart
from torchjob.sgd import runner, steps

log = logging.getLogger("torchjob.sgd")

_RETRYABLE = (WorkerDiedError, CollectiveTimeoutError, WorkerGroupStartError)
"""Failures of the infrastructure (a lost worker), which a restart can fix; a user's
exception (:class:`WorkerGroupError`) is a bug and is raised at once."""


def _loss(err: Exception) -> Loss:
    """What the lost worker was (``torchjob.rules.classify``): a worker killed from outside is
    a disruption (never charged), the OOM killer's or any other death a failure; a hang or a
    group that did not form is an infrastructure failure, never permanent."""
    if isinstance(err, WorkerDiedError):
        code = err.exitcode if err.signal is None else None
        seen = classify(ended=True, exit_code=code, signal=err.signal, oom=err.oom)
        if isinstance(seen, Failure):
            return Failure(seen.exit_code, seen.signal, seen.oom, permanent=False)
        if seen is not None:
            return seen
    return Failure(None, permanent=False)


_APEX_OPT_LEVELS = {"O1", "O2"}


class SGDConfigError(ValueError):
    """A PyTorchTrainer argument is invalid; the message names it."""


def grad_scaler_args(use_fp16: bool, apex_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Map Apex ``amp.initialize`` arguments onto ``torch.amp`` (native mixed precision).

    torch.amp replaced Apex's amp (Apex itself deprecated it), so ``use_fp16``
    means autocast plus a GradScaler. Of Apex's arguments: ``opt_level`` O1 and
    O2 both become autocast (fp32 master weights are what autocast keeps
    anyway); O0 (no mixed precision) and O3 (pure fp16, no master weights)
    have no torch.amp equivalent and are refused; ``loss_scale`` ``"dynamic"``
    is the GradScaler's default, a number becomes its ``init_scale``;
    ``num_losses`` and ``verbosity`` need nothing (the GradScaler scales each
    loss on its own). Anything else is refused, naming the key.
    """
    if not apex_args:
        return {}
    if not use_fp16:
        raise SGDConfigError("apex_args is only meaningful with use_fp16=True")
    out: dict[str, Any] = {}
    for key, value in apex_args.items():
        if key == "opt_level":
            if value not in _APEX_OPT_LEVELS:
                raise SGDConfigError(
                    f"apex_args['opt_level']={value!r} is not supported: torchjob uses torch.amp "
                    "autocast (Apex O1/O2 semantics); O0 means use_fp16=False, and O3 (pure fp16 "
                    "without fp32 master weights) has no torch.amp equivalent"
                )
        elif key == "loss_scale":
            if value != "dynamic":
                try:
                    out["init_scale"] = float(value)
                except (TypeError, ValueError):
                    raise SGDConfigError(
                        f"apex_args['loss_scale'] must be 'dynamic' or a number, got {value!r}"
                    ) from None
        elif key in ("num_losses", "verbosity", "enabled"):
            continue
        else:
            raise SGDConfigError(
                f"apex_args[{key!r}] has no torch.amp equivalent; supported keys: "
                "opt_level (O1, O2), loss_scale, num_losses, verbosity"
            )
    return out


def aggregate_stats(per_worker: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One stats dict from all workers' stats.

    ``num_samples`` and ``batch_count`` are summed; ``epoch`` is rank 0's;
    other numbers are averaged, weighted by each worker's ``num_samples`` when
    all workers report it (so ``val_loss`` and ``val_accuracy`` are exact over
    the union of the shards); anything else is rank 0's value.
    """
    if not per_worker:
        return {}
    first = per_worker[0]
    weights: list[float] | None = None
    if all(isinstance(s.get("num_samples"), int | float) for s in per_worker):
        weights = [float(s["num_samples"]) for s in per_worker]
        if sum(weights) == 0:
            weights = None
    out: dict[str, Any] = {}
    for key, value in first.items():
        values: list[Any] = [s.get(key) for s in per_worker]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if key in ("num_samples", "batch_count") and numeric:
            out[key] = sum(values)
        elif key == "epoch" or not numeric:
            out[key] = value
        elif weights is not None:
            pairs = [(float(v), w) for v, w in zip(values, weights, strict=True)]
            finite = [(v, w) for v, w in pairs if math.isfinite(v)]
            total = sum(w for _, w in finite)
            out[key] = sum(v * w for v, w in finite) / total if total else float("nan")
        else:
            out[key] = sum(float(v) for v in values) / len(values)
    return out


class PyTorchTrainer:
    """Train a model built by creator functions on ``num_replicas`` local worker processes.

    Arguments follow RaySGD's ``PyTorchTrainer`` (seed 002):

    - ``model_creator(config)`` returns a model, or several (a tuple) for GANs.
    - ``data_creator(config)`` (or ``data_creator(batch_size, config)``) returns a
      training ``Dataset``/``DataLoader``, or ``(train, validation)``. Datasets are
      wrapped in loaders with a ``DistributedSampler`` and ``batch_size //
      num_replicas`` samples per worker; loaders without a distributed sampler get one.
    - ``optimizer_creator(model_or_models, config)`` returns one or several optimizers.
    - ``loss_creator``: a loss class (``nn.MSELoss``) or ``loss_creator(config)``.
    - ``scheduler_creator(optimizer_or_optimizers, config)``, stepped per
      ``scheduler_step_freq``: ``"batch"`` (by the default train function),
      ``"epoch"`` (after each ``train()`` pass), or ``"manual"``.
    - ``train_function(config, model, train_iterator, criterion, optimizer, scheduler)``
      and ``validation_function(config, model, val_iterator, criterion, scheduler)``
      return a dict of stats; needed for several models. Seed 002's older order
      ``(models, iterator, criterion, optimizers, config)`` is recognized too.
    - ``initialization_hook()`` runs on every worker after it joined the process group.
    - ``use_fp16``: torch.amp autocast (fp16 with a GradScaler on CUDA, bf16 on CPU);
      see :func:`grad_scaler_args` for ``apex_args``.

    The workers start in the constructor; call :meth:`shutdown` when done.
    """

    def __init__(
        self,
        model_creator: Callable[..., Any],
        data_creator: Callable[..., Any],
        optimizer_creator: Callable[..., Any],
        loss_creator: Any = None,
        scheduler_creator: Callable[..., Any] | None = None,
        train_function: Callable[..., Any] | None = None,
        validation_function: Callable[..., Any] | None = None,
        initialization_hook: Callable[..., Any] | None = None,
        config: Mapping[str, Any] | None = None,
        num_replicas: int = 1,
        use_gpu: bool = False,
        batch_size: int = 16,
        backend: str = "auto",
        use_fp16: bool = False,
        apex_args: Mapping[str, Any] | None = None,
        scheduler_step_freq: str = steps.SCHEDULER_STEP_BATCH,
        *,
        timeout_s: float = 300.0,
    ) -> None:
        if num_replicas < 1:
            raise SGDConfigError(f"num_replicas must be >= 1, got {num_replicas}")
        if batch_size < 1:
            raise SGDConfigError(f"batch_size must be >= 1, got {batch_size}")
        if scheduler_step_freq not in steps.SCHEDULER_STEP_FREQS:
            raise SGDConfigError(
                f"scheduler_step_freq must be one of {', '.join(steps.SCHEDULER_STEP_FREQS)}; "
                f"got {scheduler_step_freq!r}"
            )
        if backend not in ("auto", "gloo", "nccl"):
            raise SGDConfigError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
        self.model_creator = model_creator
        self.config: dict[str, Any] = dict(config or {})
        self.num_replicas = num_replicas
        self.use_gpu = use_gpu
        self.backend = backend
        self.timeout_s = timeout_s
        self._initialization_hook = initialization_hook
        self._spec = runner.RunnerSpec(
            model_creator=model_creator,
            data_creator=data_creator,
            optimizer_creator=optimizer_creator,
            loss_creator=loss_creator,
            scheduler_creator=scheduler_creator,
            train_function=train_function,
            validation_function=validation_function,
            config=self.config,
            batch_size_per_worker=max(1, batch_size // num_replicas),
            use_fp16=use_fp16,
            scheduler_step_freq=scheduler_step_freq,
            grad_scaler_args=grad_scaler_args(use_fp16, apex_args),
        )
        self._snapshot: dict[str, Any] | None = None
        self._group: WorkerGroup | None = None
        self._start_group()

    # --- worker group ----------------------------------------------------------------
    def _start_group(self, state: Mapping[str, Any] | None = None) -> None:
        hook = (
            functools.partial(runner.call_hook, self._initialization_hook)
            if self._initialization_hook is not None
            else None
        )
        group = WorkerGroup(
            self.num_replicas,
            backend=self.backend,
            use_gpu=self.use_gpu,
            timeout_s=self.timeout_s,
            init_hook=hook,
        )
        group.start()
        try:
            group.execute(runner.setup, self._spec)
            if state is not None:
                group.execute(runner.load, dict(state))
        except BaseException:
            group.shutdown(timeout_s=0)
            raise
        self._group = group

    def _require_group(self) -> WorkerGroup:
        if self._group is None:
            raise RuntimeError("this PyTorchTrainer was shut down")
        return self._group

    def _restart_group(self, state: Mapping[str, Any] | None) -> None:
        if self._group is not None:
            self._group.shutdown(timeout_s=0 if self._group.is_broken else 10)
            self._group = None
        self._start_group(state)

    # --- training ----------------------------------------------------------------------
    def train(
        self,
        num_steps: int | None = None,
        info: Mapping[str, Any] | None = None,
        max_retries: int = 0,
        checkpoint: str | os.PathLike[str] | None = "auto",
    ) -> dict[str, Any]:
        """One pass over the training data on every replica (or ``num_steps`` batches each).

        Returns the stats aggregated over replicas (``train_loss``,
        ``num_samples``, ``epoch``, ``batch_count`` ... or whatever a custom
        ``train_function`` returns). With ``max_retries > 0``, a lost worker
        restarts the group from the state saved before this pass and the pass
        is retried: ``checkpoint="auto"`` keeps that state in memory, a path
        saves it to that file, ``None`` saves nothing (a retry then resumes
        from the last state restored or saved, else from scratch).
        """
        if max_retries < 0:
            raise SGDConfigError(f"max_retries must be >= 0, got {max_retries}")
        if max_retries > 0 or checkpoint not in (None, "auto"):
            self._take_snapshot(checkpoint)
        counters = Counters()
        while True:
            group = self._require_group()
            try:
                stats = group.execute(runner.train, num_steps, dict(info or {}))
            except _RETRYABLE as e:
                if max_retries == 0:  # no retry asked for: nothing was kept to restart from
                    raise
                # The job rules (torchjob.rules.decide_restart) over the loss: a failure is
                # charged to max_retries (no backoff), a worker killed from outside is not.
                decision = decide_restart(
                    counters,
                    RestartRules(max_restarts=max_retries),
                    _loss(e),
                    workers=self.num_replicas,
                )
                if not decision.restarts:
                    raise
                counters = decision.counters
                log.warning(
                    "train pass failed (%s); restarting %d workers from the checkpoint taken "
                    "before the pass (%s)",
                    str(e).splitlines()[0],
                    self.num_replicas,
                    decision.explanation,
                )
                self._restart_group(self._snapshot)
                continue
            return aggregate_stats(stats)

    def _take_snapshot(self, checkpoint: str | os.PathLike[str] | None) -> None:
        if checkpoint is None:
            return
        self._snapshot = self._state()
        if checkpoint != "auto":
            _atomic_torch_save(self._snapshot, Path(checkpoint))

    def validate(
        self, num_steps: int | None = None, info: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """One pass over the validation data on every replica; stats aggregated over replicas."""
        stats = self._require_group().execute(runner.validate, num_steps, dict(info or {}))
        return aggregate_stats(stats)

    # --- state ---------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._require_group().execute_single(0, runner.state)
        return state

    def save(self, checkpoint: str | os.PathLike[str]) -> str:
        """Write rank 0's models, optimizers, schedulers and epoch to ``checkpoint`` (atomically)."""
        path = Path(checkpoint)
        _atomic_torch_save(self._state(), path)
        return str(path)

    def restore(self, checkpoint: str | os.PathLike[str]) -> None:
        """Load a file written by :meth:`save` into every replica."""
        import torch

        state = torch.load(Path(checkpoint), map_location="cpu", weights_only=False)
        self._require_group().execute(runner.load, state)
        self._snapshot = state

    load = restore
    """Seed 002 calls it ``load`` in one place; same as :meth:`restore`."""

    def get_model(self) -> Any:
        """The trained model(s), unwrapped and on CPU: a tuple when ``model_creator`` returns several."""
        state = self._state()
        created = self.model_creator(dict(self.config))
        models = list(created) if isinstance(created, tuple | list) else [created]
        for model, sd in zip(models, state["models"], strict=True):
            model.load_state_dict(sd)
            model.cpu()
        return tuple(models) if isinstance(created, tuple | list) else models[0]

    @property
    def epoch(self) -> int:
        """Training passes completed (restored by :meth:`restore`)."""
        return int(self._require_group().execute_single(0, runner.epoch))

    def shutdown(self) -> None:
        """Stop the workers. Save or ``get_model()`` first: the replicas go with them."""
        if self._group is not None:
            self._group.shutdown(timeout_s=0 if self._group.is_broken else 10)
            self._group = None

    def __enter__(self) -> PyTorchTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _atomic_torch_save(state: Mapping[str, Any], path: Path) -> None:
    """Write to a temp file beside ``path``, fsync, then rename: never a torn checkpoint."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(dict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
