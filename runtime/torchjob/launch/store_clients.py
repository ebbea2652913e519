"""Connections to the rendezvous store, kept across generations.

Every generation of a group meets in rank 0's TCPStore (``MASTER_ADDR:MASTER_PORT``, under
the generation's key prefix), and each rank talks to it for three uses: the rendezvous of
``init_process_group``, its heartbeat (``torchjob.launch.heartbeat``) and, for an NCCL group,
its abort listener (``torchjob.launch.abort``); the driver has its own for its beat. Each use
had opened a new client connection per generation. On a host where a whole group connects
at once, that is what a re-formation waited for: at 32 and 64 gloo ranks on the 2-core
gVisor sandbox, a few of 32 new connections took 5 s (c10d logs "timed out after 2500ms
while trying to connect" and retries), so every re-formation cost 5-11 s, while a group
whose ranks kept their connections re-formed in 0.1 s (32) and 0.3-0.5 s (64)
(bench/results/2026-11-26m/README.md has the probe and the curve).

So a process keeps one client per (use, address, port) and hands it out again in the next
generation after one cheap request shows it still answers. It does not when the store's
process died (rank 0 lost: the connection was closed and the request fails at once) or went
silent (no answer within :data:`PROBE_S`; see :func:`within`: a request to a frozen
server can block for ever whatever the client's timeout); then it connects anew. Each use has
its own connection: a rendezvous ``get`` that blocks until a peer arrives must not hold up a
heartbeat (a client's requests are serialised). A forked child never uses its parent's
connections: it starts with none (the inherited objects are kept, never destroyed, since
destroying one would close a socket the parent still uses).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from torchjob.launch import store_probe
from torchjob.launch.layout import StoreLayout
from torchjob.launch.placement import Placement
from torchjob.launch.settings import SLOW_EXIT_S

T = TypeVar("T")

PROBE_S = 2.0
"""How long a kept connection may take to answer before it is replaced by a new one."""

PROBE_KEY = StoreLayout.PROBE_KEY

_lock = threading.Lock()
_clients: dict[tuple[str, str, int], Any] = {}
_inherited: list[Any] = []
"""A forked child's copies of its parent's clients: never used, never destroyed."""
_pending: dict[threading.Thread, float] = {}
"""The request threads of :func:`within` still running, each with the moment by which its
request should have ended one way or the other (see :func:`settle`)."""
_closing = threading.Event()
"""Set once the interpreter exits: :func:`within` then starts no request."""

SETTLE_FACTOR = 3.0
"""A request given ``seconds`` by its caller is expected to end within this many times that,
plus :data:`SETTLE_SLACK_S`: a ``TCPStore`` constructor whose ``connect`` timeout runs out
retries once after about as long again (measured: 2 s of connect, 4.1 s in all); beyond it,
blocked for ever."""

SETTLE_SLACK_S = 5.0
"""What a loaded host adds to that: a 1 s connect took more than 3 s in a CI run whose
cluster tests shared the 2 cores, came back during the finalization and aborted the
process (tests/unit/test_store_clients.py). Only a request blocked on a frozen server
waits it out at exit, once."""


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it
    _inherited.extend(_clients.values())
    _inherited.extend(_served.values())  # their threads are not in the child
    _clients.clear()
    _served.clear()
    _pending.clear()  # their threads are not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def within(seconds: float, request: Callable[[], T]) -> T:
    """``request()`` (a store request), or :class:`TimeoutError` after ``seconds``.

    A ``TCPStore`` client waits for a reply without a deadline in several requests: measured
    with torch 2.15 against a server that was SIGSTOPped, ``check`` blocks for ever and ``get``
    logs its timeout, then blocks for ever in the cancellation that follows. A frozen node or
    dropped packets look the same. So a request whose answer decides something runs on a
    daemon thread of its own, which stays blocked if the server never answers (the connection
    is then discarded, never used again). Once the interpreter exits, it starts none
    (:func:`settle`)."""
    out: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            out.append((True, request()))
        except BaseException as e:  # handed to the caller
            out.append((False, e))
        finally:
            done.set()
            with _lock:
                _pending.pop(threading.current_thread(), None)

    thread = threading.Thread(target=run, name="torchjob-store-request", daemon=True)
    with _lock:  # with settle's: a request is either refused or waited for at the exit
        if _closing.is_set():
            raise TimeoutError("the process is exiting: no store request is started")
        _pending[thread] = time.monotonic() + SETTLE_FACTOR * seconds + SETTLE_SLACK_S
        thread.start()
    if not done.wait(seconds):
        raise TimeoutError(f"the store did not answer within {seconds:g}s")
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


@atexit.register
def settle() -> None:
    """At the interpreter's exit, wait for the :func:`within` requests still running, each up
    to the moment by which it should end (:data:`SETTLE_FACTOR`), and start no new one.

    A daemon thread that comes back from torch's C++ code (a ``TCPStore`` constructor whose
    server is gone fails after its retries) once the interpreter is finalizing is ended by
    CPython with a forced unwind, which torch's code turns into ``std::terminate``: a worker
    whose training had finished then died "terminate called without an active exception"
    (exit 134 or 139) and failed its job. Waiting here, before the finalization, lets the
    request come back while Python still runs; one blocked on a frozen server never comes
    back, and costs nothing past its moment."""
    with _lock:  # a thread in within() between its check and its start would slip by
        _closing.set()
        pending = dict(_pending)
    t0 = time.monotonic()
    for thread, until in pending.items():
        thread.join(timeout=max(0.0, until - time.monotonic()))
    if (took := time.monotonic() - t0) > SLOW_EXIT_S:
        print(
            f"[torchjob] waited {took:.1f}s at exit for {len(pending)} store request(s)",
            file=sys.stderr,
        )


def _answers(store: Any, timeout: timedelta) -> bool:
    probe_s = min(PROBE_S, timeout.total_seconds())
    try:
        store.set_timeout(timedelta(seconds=probe_s))
        within(probe_s, lambda: store.check([PROBE_KEY]))
        store.set_timeout(timeout)
    except Exception:  # closed by a dead server, or silent: DistNetworkError, TimeoutError
        return False
    return True


def client(
    use: str,
    addr: str,
    port: int,
    *,
    connect: timedelta,
    timeout: timedelta,
    use_libuv: bool = True,
) -> Any:
    """This process's ``TCPStore`` client of ``addr:port`` for ``use``: the one it already has
    if that still answers, else a new one (connecting for up to ``connect``; ``use_libuv``:
    ``RuntimeSettings.use_libuv``, images whose torch lacks libuv set ``USE_LIBUV=0``). Its
    requests time out after ``timeout``. Raises what ``TCPStore`` raises when it cannot connect, or
    :class:`TimeoutError` when the server does not answer within ``connect`` and
    :data:`PROBE_S`."""
    key = (use, addr, port)
    with _lock:
        store = _clients.pop(key, None)
    if store is None or not _answers(store, timeout):
        import torch.distributed as dist

        # Not before its server listens: TCPStore's own retries back off, to seconds.
        began = time.monotonic()
        store_probe.await_listening((addr, port), connect.total_seconds())
        left = timedelta(seconds=max(connect.total_seconds() - (time.monotonic() - began), 1.0))
        # Connecting validates with a request, which a frozen server never answers either.
        store = within(
            left.total_seconds() + PROBE_S,
            lambda: dist.TCPStore(  # type: ignore[attr-defined]  # re-exported from torch._C
                addr, port, None, False, left, use_libuv=use_libuv
            ),
        )
        store.set_timeout(timeout)
    with _lock:
        _clients[key] = store
    return store


def discard(use: str, addr: str, port: int) -> None:
    """Drop ``use``'s connection to ``addr:port`` (its requests failed): the next
    :func:`client` connects anew instead of probing it."""
    with _lock:
        _clients.pop((use, addr, port), None)


_served: dict[int, Any] = {}
"""The stores this process serves (a driver, for its local groups), by id."""


def serve(addr: str, timeout: timedelta, *, use_libuv: bool = True) -> Any:
    """A ``TCPStore`` served by this process on a free port of ``addr`` (``.port``), until
    :func:`stop_serving`. It runs a thread of its own (libuv's loop) that Python does not
    count: :func:`serving` says how many, for the checks that fork this process."""
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]
        addr, 0, None, True, timeout, wait_for_workers=False, use_libuv=use_libuv
    )
    with _lock:
        _served[id(store)] = store
    return store


def stop_serving(store: Any) -> None:
    """Stop serving ``store`` (its thread ends with it) once nothing else refers to it."""
    with _lock:
        _served.pop(id(store), None)


def serving() -> int:
    """How many stores this process serves: threads a fork would not carry."""
    with _lock:
        return len(_served)


def held() -> list[tuple[str, str, int]]:
    """The (use, address, port) of every connection this process keeps."""
    with _lock:
        return sorted(_clients)


class DriverStore:
    """A local group's rendezvous store, served by the driver (``WorkerGroup``) for the
    group's life, where the driver imported torch: a lost rank 0 then moves nothing, and every
    survivor keeps its connections to the store across re-formations (above), so a
    re-formation opens none (new connections cost 5 s per re-formation at 32 gloo ranks on
    the 2-core sandbox, docs/runtime.md). Else rank 0 serves it (a pod's group: its port is
    the job's; a driver without torch: a new port per generation)."""

    def __init__(self, timeout: timedelta, *, use_libuv: bool) -> None:
        self.timeout = timeout
        self.use_libuv = use_libuv
        self.server: Any = None
        self.formation = 0
        """The current formation's number in the served store (0: not served). The store
        outlives a formation: each keys its rendezvous apart, whatever its generation (a
        WorkerGroup may re-form into the same one): ``StoreLayout.rendezvous``."""

    def place(self, placement: Placement, *, served: bool) -> Placement:
        """``placement`` with its store's port: this store's when ``served``, else a free one
        (or the pod's) for rank 0 to serve."""
        if not served:
            self.formation = 0
            return placement.with_port()
        self.formation += 1
        if self.server is None:
            self.server = serve(placement.master_addr, self.timeout, use_libuv=self.use_libuv)
        return dataclasses.replace(placement, master_port=self.server.port)

    def stop(self) -> None:
        if self.server is not None:
            stop_serving(self.server)
            self.server = None
