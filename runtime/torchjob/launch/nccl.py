"""Re-forming an NCCL group in place after a lost peer (issue 26, item 4). UNVERIFIED on GPUs:
off unless ``TORCHJOB_NCCL_REFORM=1``; see docs/runtime.md (GPU) for what runs by default.

A gloo group learns of a dead peer at once (its TCP connections close) and a survivor can
leave it with ``destroy_process_group``. An NCCL group does not: the survivors' kernels wait
on the dead peer (over NVLink or shared memory nothing closes) until the collective's
timeout, and destroying a communicator whose peer is gone may hang. So, for an NCCL group:

* every formed rank runs an :class:`AbortListener` (a thread with its own store client) that
  aborts this process's communicators (``_abort_process_group``: ``ncclCommAbort``, not
  collective) when the generation's store holds the key ``abort`` or stops answering (rank 0,
  which serves it, is gone). The aborted collective raises ("communicator was aborted": a peer
  failure), the rank leaves the group and answers the driver;
* the driver sets that key when it sees a worker die (:func:`request_abort`);
* the survivors keep their processes, their CUDA context and what is on the device (the model,
  the optimizer state); a replacement process takes the lost rank's slot (its rank, its local
  rank and so its GPU: ``WorkerGroup.heal`` keeps the slots of an NCCL group), and the next
  generation forms a new communicator on the next generation's store.

The workers run with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` unless it is set: its default tears
the process down on a communicator error, which would kill the survivors this keeps.
"""

from __future__ import annotations

import contextlib
import os
import threading
from datetime import timedelta
from typing import Any

ENV_NCCL_REFORM = "TORCHJOB_NCCL_REFORM"
ABORT_KEY = "abort"
POLL_S = 0.1


def enabled() -> bool:
    """``TORCHJOB_NCCL_REFORM=1``: NCCL groups re-form in place (unverified; off by default)."""
    return os.environ.get(ENV_NCCL_REFORM, "") == "1"


def in_place(backend: str) -> bool:
    """Whether a group of ``backend`` broken by a lost peer re-forms in its survivors: gloo;
    NCCL only with ``TORCHJOB_NCCL_REFORM=1`` (unverified on GPUs)."""
    return backend == "gloo" or (backend == "nccl" and enabled())


def worker_env() -> dict[str, str]:
    """What an NCCL worker that may be kept after a peer's loss needs in its environment."""
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" in os.environ:
        return {}
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


def abort_group() -> None:
    """Leave every process group of this process without a collective: abort the
    communicators (``_abort_process_group`` where this torch has it, else destroy)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort()
    else:
        dist.destroy_process_group()


def _store(addr: str, port: int, generation: str, timeout_s: float) -> Any:
    import torch.distributed as dist

    use_libuv = os.environ.get("USE_LIBUV", "1") not in ("0", "false", "False")
    store = dist.TCPStore(  # type: ignore[attr-defined]
        addr, port, None, False, timedelta(seconds=timeout_s), use_libuv=use_libuv
    )
    return dist.PrefixStore(f"torchjob/g{generation}/nccl", store)  # type: ignore[attr-defined]


class AbortListener:
    """One rank's listener for one generation of an NCCL group (a daemon thread)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.aborted = False
        self._thread = threading.Thread(target=self._run, name="torchjob-nccl-abort", daemon=True)

    def start(self) -> AbortListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            store = _store(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                timeout_s=30.0,
            )
        except Exception:
            return  # no store: the collective's timeout still applies
        while not self._stop.wait(POLL_S):
            try:
                if not store.check([ABORT_KEY]):
                    continue
            except Exception:
                pass  # the store is gone with rank 0: a peer is lost
            if not self._stop.is_set():
                self.aborted = True
                # Aborting a broken group may itself fail; it is left either way.
                with contextlib.suppress(Exception):
                    abort_group()
            return


def request_abort(addr: str, port: int, generation: int) -> bool:
    """The driver, on a dead worker of an NCCL group: tell the generation's ranks to abort
    their communicators. False when the store does not answer (its rank 0 is the dead one:
    the listeners abort on their own)."""
    try:
        _store(addr, port, str(generation), timeout_s=2.0).set(ABORT_KEY, "1")
    except Exception:
        return False
    return True
