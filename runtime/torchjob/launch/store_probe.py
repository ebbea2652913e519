"""Whether the hosts of a group's store and members still answer, asked from outside the
workers.

While a generation forms, every worker waits for rank 0's store (a ``TCPStore`` on rank 0's
pod) up to the collective timeout; the heartbeat watchdog that finds a silent peer runs only
once the group has formed (``torchjob.launch.heartbeat``). When the store's node vanishes in
that window (seen on 3 real nodes: a node lost every ~40 s, bench/results/2026-11-29d), the
other pods learn of it only from the node controller, ~40 s later.

A pod's driver asks instead (:class:`StoreProbe`, a thread): a TCP connect to the store's
address, every ``every_s`` with a ``timeout_s`` limit. A host that is there answers, with a
SYN-ACK (the store is up) or a reset (its process has not opened the port yet: late, not
silent); a vanished node, a frozen one or a partition answers nothing, and the connect times
out. A name that does not resolve, or no route, is not counted either way: that is this
pod's network, not the peer. Past ``silent_after_s`` of nothing but timeouts the store's host
is silent (:meth:`StoreProbe.silent_for`), and the driver reports rank 0 silent to the
operator as the watchdog would (``torchjob.train.controller``).

The same question asked of many hosts at once is a :func:`sweep` (one round) or a
:class:`HostsProbe` (a round every ``every_s``): a node that vanishes takes all of its pods,
and once one member is found silent its node-mates are found by their silence to a connect
(``torchjob.train.recovery``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Generic, Protocol, Self, TypeVar

Connect = Callable[[tuple[str, int], float], socket.socket]
K = TypeVar("K")

SWEEP_PARALLEL = 32
"""At most this many connects of one :func:`sweep` in flight at once."""

MOOT_EVERY_S = 0.05
"""How often a :func:`sweep` asks its ``moot`` whether the hosts not answered yet still
matter."""

SWEEP_TIMEOUT_S = 2.0
"""How long a member's host has to answer one connect of the sweep that follows a silent
peer (``torchjob.train.recovery.reports``): a host that is there answers at once (a
SYN-ACK, or a reset), from its kernel. The heartbeat watchdog tells the driver this long
before it would find rank 0 silent (``heartbeat.Watchdog``: ``StoreQuiet``), so that the
sweep runs while the threshold runs out instead of after it."""


def _connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
    return socket.create_connection(address, timeout=timeout_s)


LISTEN_POLL_S = 0.05
"""How often :func:`await_listening` tries to connect while nothing listens yet."""


def await_listening(
    address: tuple[str, int],
    seconds: float,
    connect: Connect = _connect,
    *,
    poll_s: float = LISTEN_POLL_S,
) -> bool:
    """Wait up to ``seconds`` for a server to listen at ``address`` (a connect succeeds);
    True once one does, False at the deadline.

    ``TCPStore``'s client, started before its server, retries its connect with a growing
    backoff: with torch 2.15, a client that began 2, 5 and 8 s before the server connected
    1.0, 3.0 and 5.0 s after the server listened (``bench/store_connect.py``). A joiner forms
    as soon as its generation is published, while the new rank 0 still trains to its next
    report, and met its store that late: most of the 4.7 s between the survivors' stop and
    the group's formation in the notice handovers of bench/results/2026-12-03b. Connecting
    here first, every ``poll_s``, the client then connects at once."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            connect(address, min(left, 1.0)).close()
            return True
        except OSError:  # refused (nothing listens yet), no answer, a name not there yet
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
    return False


def answered(
    address: tuple[str, int], timeout_s: float, connect: Connect = _connect
) -> bool | None:
    """One probe: True when the host answered (connected, or refused), False when nothing
    answered within ``timeout_s``, None when this side could not ask (no name, no route)."""
    try:
        connect(address, timeout_s).close()
    except TimeoutError:
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return None
    return True


def sweep(
    addresses: Mapping[K, tuple[str, int]],
    timeout_s: float,
    connect: Connect | None = None,
    parallel: int = SWEEP_PARALLEL,
    moot: Callable[[frozenset[K]], bool] | None = None,
) -> dict[K, bool | None]:
    """One probe of every address at once (:func:`answered` for each, at most ``parallel``
    in flight): a round takes ``timeout_s`` when a host is silent, moments when all answer.

    ``moot`` (asked every :data:`MOOT_EVERY_S` with the keys not answered yet) ends the wait
    when it says they no longer matter; those keys then read None (not asked). A silent
    peer's report sweeps while the watchdog is still declaring the peer's node-mates: once
    all the hosts that have not answered are declared, waiting out their timeout adds 2 s
    to the report for nothing (seen on the fleet bench: every report of a 4-pod node)."""
    connect = connect or _connect
    if len(addresses) <= 1 and moot is None:
        return {k: answered(a, timeout_s, connect) for k, a in addresses.items()}
    if not addresses:
        return {}
    pool = ThreadPoolExecutor(min(parallel, len(addresses)), "torchjob-sweep")
    try:
        asked = {k: pool.submit(answered, a, timeout_s, connect) for k, a in addresses.items()}
        pending = frozenset(asked)
        while pending:
            wait([asked[k] for k in pending], timeout=None if moot is None else MOOT_EVERY_S)
            pending = frozenset(k for k in pending if not asked[k].done())
            if pending and moot is not None and moot(pending):
                break
        return {k: f.result() if f.done() else None for k, f in asked.items()}
    finally:
        # Connects left running end by their own timeout, on the pool's threads.
        pool.shutdown(wait=False, cancel_futures=True)


class Probing(Protocol):
    def silent_for(self) -> float: ...
    def stop(self) -> None: ...


class Silences(Protocol[K]):
    """What :class:`HostsProbe` answers (a fake in tests)."""

    def silent(self) -> dict[K, float]: ...
    def stop(self) -> None: ...


class HostsProbe(Generic[K]):
    """Probes every address of ``addresses`` from one daemon thread, a :func:`sweep` every
    ``every_s``, until :meth:`stop`; :meth:`silent` says which have answered nothing since
    when."""

    def __init__(
        self,
        addresses: Mapping[K, tuple[str, int]],
        *,
        every_s: float = 1.0,
        timeout_s: float = 2.0,
        connect: Connect = _connect,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.addresses = dict(addresses)
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._connect = connect
        self._clock = clock
        self._silent_since: dict[K, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, answers: Mapping[K, bool | None], started: float) -> None:
        """Record one round that started at ``started`` (monotonic): an answer ends a host's
        silence, a timeout starts one, a question this side could not ask changes nothing."""
        for k, answer in answers.items():
            if answer is True:
                self._silent_since.pop(k, None)
            elif answer is False:
                self._silent_since.setdefault(k, started)

    def silent(self) -> dict[K, float]:
        """Seconds since the first of each host's unbroken run of unanswered probes, for the
        hosts in one."""
        now = self._clock()
        return {k: now - since for k, since in dict(self._silent_since).items()}

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="torchjob-host-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            self.record(sweep(self.addresses, self.timeout_s, self._connect), started)
            self._stop.wait(max(0.0, self.every_s - (self._clock() - started)))


class StoreProbe(HostsProbe[None]):
    """Probes the one ``address`` of a forming group's store."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        every_s: float = 1.0,
        timeout_s: float = 2.0,
        connect: Connect = _connect,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            {None: address}, every_s=every_s, timeout_s=timeout_s, connect=connect, clock=clock
        )
        self.address = address

    def observe(self, answer: bool | None, started: float) -> None:
        """Record one probe that started at ``started`` (monotonic) and got ``answer``."""
        self.record({None: answer}, started)

    def silent_for(self) -> float:
        """Seconds since the first of an unbroken run of unanswered probes (0: answering)."""
        return self.silent().get(None, 0.0)
