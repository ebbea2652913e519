"""A generation's abort key: every rank leaves a broken group at once, whatever its size.

A group that lost a peer must be left by every survivor before it can re-form. Where nothing
tells them, they learn it from their own collectives: in a gloo ring each rank talks only to
its two neighbours, so the news travels hop by hop (a rank's collective fails, it closes its
connections, its neighbour's fails...). At 32 and 64 ranks on a small machine that cascade
was most of a recovery (5.5 s and 10 s of a 6.6 s and 17 s recovery, docs/runtime.md
"Recovery vs world size"). An NCCL group's survivors never learn it at all: their kernels
wait on the dead peer until the timeout.

So every formed rank of a group of more than one runs an :class:`AbortListener` (a thread
with its own store client) that polls the generation's store for the key ``abort`` every
``POLL_S``. Whoever learns of a loss first sets it (:func:`request_abort`): the driver that
saw one of its workers die, and any rank whose collective failed because of a peer (the one
place a rank on another host learns of it). Every listener then leaves at once, with the
action its backend needs: a gloo rank shuts down its group's connections, so its blocked
collective fails now; an NCCL rank aborts its communicators (``torchjob.launch.nccl``). A
store that stops answering means the same (rank 0, which serves it, is gone).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

ABORT_KEY = "abort"
POLL_S = 0.1


def _store(addr: str, port: int, generation: str, timeout_s: float) -> Any:
    import torch.distributed as dist

    use_libuv = os.environ.get("USE_LIBUV", "1") not in ("0", "false", "False")
    store = dist.TCPStore(  # type: ignore[attr-defined]
        addr, port, None, False, timedelta(seconds=timeout_s), use_libuv=use_libuv
    )
    return dist.PrefixStore(f"torchjob/g{generation}/group", store)  # type: ignore[attr-defined]


class AbortListener:
    """One rank's listener for one generation (a daemon thread): ``leave`` runs once, on this
    thread, when the generation's abort key appears or its store stops answering."""

    def __init__(self, leave: Callable[[], None]) -> None:
        self._leave = leave
        self._stop = threading.Event()
        self.aborted = False
        self._thread = threading.Thread(target=self._run, name="torchjob-abort", daemon=True)

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
            return  # no store: the collective's own failure (or timeout) still applies
        while not self._stop.wait(POLL_S):
            try:
                if not store.check([ABORT_KEY]):
                    continue
            except Exception:
                pass  # the store is gone with rank 0: a peer is lost
            if not self._stop.is_set():
                self.aborted = True
                # Leaving a broken group may itself fail; it is left either way.
                with contextlib.suppress(Exception):
                    self._leave()
            return


def request_abort(addr: str, port: int, generation: int | str) -> bool:
    """Tell every rank of ``generation`` to leave its group now. False when the store does
    not answer (its rank 0 is the lost one: the listeners leave on their own). A plain
    connection is tried first: c10d's client would retry a refused one for seconds, and log
    each try with a stack trace."""
    try:
        socket.create_connection((addr, port), timeout=1.0).close()
    except OSError:
        return False
    try:
        _store(addr, port, str(generation), timeout_s=2.0).set(ABORT_KEY, "1")
    except Exception:
        return False
    return True


def request_abort_soon(addr: str, port: int, generation: int | str) -> None:
    """:func:`request_abort` on a daemon thread: a rank whose collective just failed never
    waits on a store that may be the lost one."""
    threading.Thread(
        target=request_abort,
        args=(addr, port, generation),
        name="torchjob-abort-request",
        daemon=True,
    ).start()
