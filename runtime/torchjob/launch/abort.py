"""A generation's abort key: the ranks of an NCCL group leave it at once when a peer is lost.

A gloo group learns of a lost peer from its own connections (they close, and each survivor
that leaves closes its own, so the news goes round the ring in a fraction of a second: 0.3 s
at 32 ranks, docs/runtime.md "Recovery vs world size"). An NCCL group's survivors never
learn it: their kernels wait on the dead peer until the timeout. So every formed rank of an
NCCL group that re-forms in place (``torchjob.launch.nccl``) runs an :class:`AbortListener`
(a thread with its own store client) that polls the generation's store for the key
``abort`` (``StoreLayout.group``/``ABORT_KEY``) every ``POLL_S`` and aborts its communicators when the key appears or the store
stops answering (rank 0, which serves it, is gone). The driver sets the key when it sees one
of its workers die (:func:`request_abort`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torchjob.launch.layout import StoreLayout, prefixed

ABORT_KEY = StoreLayout.ABORT_KEY
POLL_S = 0.1


def _store(use: str, layout: StoreLayout, timeout_s: float) -> Any:
    from torchjob.launch import store_clients

    timeout = timedelta(seconds=timeout_s)
    store = store_clients.client(
        use,
        layout.addr,
        layout.port,
        connect=timeout,
        timeout=timeout,
        use_libuv=layout.use_libuv,
    )
    return prefixed(layout.group, store)


class AbortListener:
    """One rank's listener for one generation (a daemon thread): ``leave`` runs once, on this
    thread, when the generation's abort key appears or its store stops answering."""

    def __init__(self, leave: Callable[[], None], layout: StoreLayout) -> None:
        self._leave = leave
        self._layout = layout
        self._stop = threading.Event()
        self.aborted = False
        self._thread = threading.Thread(target=self._run, name="torchjob-abort", daemon=True)

    def start(self) -> AbortListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        layout = self._layout
        try:
            # A plain connection first: a store already gone with its rank 0 (lost right
            # after the formation) is seen at once, where c10d's client would retry for its
            # whole timeout and log each try with a stack trace.
            socket.create_connection((layout.addr, layout.port), timeout=5.0).close()
            store = _store("abort", layout, timeout_s=30.0)
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


def request_abort(layout: StoreLayout) -> bool:
    """Tell every rank of ``layout``'s generation to leave its group now. False when the store does
    not answer (its rank 0 is the lost one: the listeners leave on their own). A plain
    connection is tried first: c10d's client would retry a refused one for seconds, and log
    each try with a stack trace."""
    try:
        socket.create_connection((layout.addr, layout.port), timeout=1.0).close()
    except OSError:
        return False
    try:
        _store("abort-request", layout, timeout_s=2.0).set(ABORT_KEY, "1")
    except Exception:
        return False
    return True
