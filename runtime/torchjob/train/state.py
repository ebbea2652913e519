"""``TrainState``: everything a resumed run needs, saved sharded by every rank (DCP).

For models too large for one process (FSDP2 ``fully_shard``) and for any other model: every
rank writes its own shards through ``torch.distributed.checkpoint`` (DCP), under the same
atomic ``_COMMITTED`` marker as a whole-object :class:`~torchjob.train.Checkpoint`, and a
resume loads it at the same or at another world size, resharded by DCP: no conversion step,
no gather on one rank. The loop users write::

    import torch
    import torchjob.train as train
    from torchjob.train import Checkpoint, TrainState
    from torchjob.train.torch import prepare_data_loader, prepare_model

    def train_func(config):
        model = prepare_model(build_model(), parallel_strategy="fsdp")  # or "ddp", or None
        opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
        loader = prepare_data_loader(build_loader())
        state = TrainState(model, opt, data_loader=loader)  # + lr_scheduler=, extra=
        if (ckpt := train.get_checkpoint()) is not None:
            ckpt.load_state(state)  # every rank reads its shards; any world size
        while state.step < config["steps"]:
            for batch in loader:
                loss = model(batch).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                state.step += 1
                if state.step % config["checkpoint_every"] == 0 or train.should_stop():
                    # collective: every rank passes the state at the same report
                    train.report({"loss": loss.item(), "step": state.step},
                                 checkpoint=Checkpoint.from_state(state))

``report(metrics, checkpoint=Checkpoint.from_state(state))`` is collective. With
``CheckpointConfig(async_commit=True)`` (the default) it returns once this rank's shards are
copied into host memory (DCP ``async_save`` staging); the write runs on a background thread,
and the checkpoint is committed (manifest with every file's size and sha256, then the
marker) only when every rank's files are written and fsynced. One save is in flight at a
time: the next checkpointing report waits for the previous one. A stop, a failure and the
end of ``fit()`` wait for it as for whole-object checkpoints. ``async_commit=False``: the
report returns once the checkpoint is committed.

``get_checkpoint()`` then returns a :class:`~torchjob.train.Checkpoint` on the run's storage
(not a local copy: rank 0 reads no shard) and ``Checkpoint.load_state(state)`` loads it:
the files are verified against the manifest (each rank checks a share of them), and a
missing, truncated or corrupt file is a ``CheckpointError`` naming it.

What ``TrainState`` covers: the model and optimizer(s) through
``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict`` (FSDP2
sharded ``DTensor`` state, DDP and plain modules alike; keys are canonical FQNs, so a DDP
checkpoint loads into a plain model and back), the lr scheduler, ``step``, each rank's RNG
state (Python, NumPy, torch CPU and CUDA), the data loader's position and any ``extra``
``Stateful`` objects or picklable values. It implements DCP's ``Stateful`` protocol
(``state_dict`` / ``load_state_dict``), so ``dcp.save({"app": state})`` works too.

RNG at another world size: ranks that existed at save time restore their own RNG; a rank
beyond the old world size keeps the RNG it has (seed it from its rank if it matters).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchjob.checkpoint.rng import capture_rng, restore_rng

MODEL = "model"
OPTIMIZER = "optim"
LR_SCHEDULER = "lr_scheduler"
STEP = "step"
EXTRA = "extra"
DATA = "data"
RNG_PREFIX = "rng_rank"
"""Each rank's RNG is saved under its own key (``rng_rank0``, ``rng_rank1`` ...)."""


def _rank() -> int:
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    return dist.get_rank() if initialized else 0


def rng_key(rank: int) -> str:
    return f"{RNG_PREFIX}{rank}"


class TrainState:
    """The state of a training run, saved and loaded sharded (DCP's ``Stateful`` protocol).

    ``TrainState(model, optimizer, lr_scheduler=..., data_loader=..., step=0, extra={...})``.
    ``model`` is the prepared model (FSDP2, DDP or plain); ``optimizer`` one optimizer or a
    list (or ``None``); ``data_loader`` a loader from ``prepare_data_loader`` (its position)
    or any object with ``state_dict``/``load_state_dict`` (e.g. torchdata's
    ``StatefulDataLoader``); ``extra`` maps names to ``Stateful`` objects or picklable values
    (read back from ``state.extra`` after a load). ``step`` is yours to advance.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        lr_scheduler: Any | None = None,
        data_loader: Any | None = None,
        step: int = 0,
        extra: Mapping[str, Any] | None = None,
        rng: bool = True,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TrainState: model must be a torch.nn.Module, got {type(model)}")
        if optimizer is None:
            optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            optimizers = [optimizer]
        else:
            optimizers = list(optimizer)
        for o in optimizers:
            if not isinstance(o, torch.optim.Optimizer):
                raise TypeError(f"TrainState: optimizer must be a torch.optim.Optimizer, got {o!r}")
        if lr_scheduler is not None and not hasattr(lr_scheduler, "state_dict"):
            raise TypeError("TrainState: lr_scheduler has no state_dict()")
        self.model = model
        self.optimizers = optimizers
        self.lr_scheduler = lr_scheduler
        self.data_loader = data_loader
        self.step = int(step)
        self.extra: dict[str, Any] = dict(extra or {})
        self.rng = rng

    def __repr__(self) -> str:
        return (
            f"TrainState(step={self.step}, model={type(self.model).__name__}, "
            f"optimizers={len(self.optimizers)}, extra={sorted(self.extra)})"
        )

    # --- DCP's Stateful protocol ----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's view: sharded tensors stay sharded (``DTensor``), nothing is gathered."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizers)
        out: dict[str, Any] = {MODEL: model_sd, STEP: self.step}
        if self.optimizers:
            out[OPTIMIZER] = optim_sd
        if self.lr_scheduler is not None:
            out[LR_SCHEDULER] = self.lr_scheduler.state_dict()
        data = _data_state(self.data_loader)
        if data is not None:
            out[DATA] = data
        if self.extra:
            out[EXTRA] = {
                k: (v.state_dict() if _is_stateful(v) else v) for k, v in self.extra.items()
            }
        if self.rng:
            out[rng_key(_rank())] = pickle.dumps(capture_rng())
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`'s shape (entries it lacks are left as they are)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=state_dict[MODEL],
            optim_state_dict=state_dict.get(OPTIMIZER, {}) if self.optimizers else {},
        )
        self.step = int(state_dict.get(STEP, self.step))
        if self.lr_scheduler is not None and LR_SCHEDULER in state_dict:
            self.lr_scheduler.load_state_dict(state_dict[LR_SCHEDULER])
        if DATA in state_dict:
            _load_data_state(self.data_loader, state_dict[DATA])
        for k, v in dict(state_dict.get(EXTRA, {})).items():
            current = self.extra.get(k)
            if current is not None and _is_stateful(current):
                current.load_state_dict(v)
            else:
                self.extra[k] = v
        blob = state_dict.get(rng_key(_rank()))
        if self.rng and isinstance(blob, bytes | bytearray):
            # our own checkpoint, verified against its manifest
            restore_rng(pickle.loads(bytes(blob)))


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _data_state(loader: Any) -> Any:
    if loader is None:
        return None
    if callable(getattr(loader, "position", None)):
        return {"position": loader.position().to_dict()}
    if _is_stateful(loader):
        return {"state": loader.state_dict()}
    raise TypeError(
        "TrainState: data_loader must come from prepare_data_loader or have state_dict()"
    )


def _load_data_state(loader: Any, data: Mapping[str, Any]) -> None:
    if loader is None:
        return
    if "position" in data and callable(getattr(loader, "resume_from", None)):
        from torchjob.checkpoint import DataPosition

        loader.resume_from(DataPosition.from_dict(dict(data["position"])))
    elif "state" in data and _is_stateful(loader):
        loader.load_state_dict(data["state"])


class StateCheckpoint:
    """A checkpoint still to be written: ``Checkpoint.from_state(state)``, passed to ``report``.

    Every rank passes one at the same ``report``; each writes its own shards. After the
    commit the checkpoint is an ordinary :class:`~torchjob.train.Checkpoint` directory (DCP
    files plus the manifest and marker), which ``get_checkpoint()`` and ``Result.checkpoint``
    return and :meth:`Checkpoint.load_state` loads.
    """

    def __init__(self, state: TrainState | Any) -> None:
        if not _is_stateful(state):
            raise TypeError(
                "Checkpoint.from_state needs a TrainState (or a DCP Stateful object), "
                f"got {type(state).__name__}"
            )
        self.state = state

    def __repr__(self) -> str:
        return f"StateCheckpoint({self.state!r})"
