"""Whether the host of a forming group's store still answers, asked from outside the workers.

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
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

Connect = Callable[[tuple[str, int], float], socket.socket]


def _connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
    return socket.create_connection(address, timeout=timeout_s)


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


class Probing(Protocol):
    def silent_for(self) -> float: ...
    def stop(self) -> None: ...


class StoreProbe:
    """Probes ``address`` from a daemon thread until :meth:`stop`."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        every_s: float = 1.0,
        timeout_s: float = 2.0,
        connect: Connect = _connect,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._connect = connect
        self._clock = clock
        self._silent_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self, answer: bool | None, started: float) -> None:
        """Record one probe that started at ``started`` (monotonic) and got ``answer``."""
        if answer is True:
            self._silent_since = None
        elif answer is False and self._silent_since is None:
            self._silent_since = started

    def silent_for(self) -> float:
        """Seconds since the first of an unbroken run of unanswered probes (0: answering)."""
        since = self._silent_since
        return 0.0 if since is None else self._clock() - since

    def start(self) -> StoreProbe:
        self._thread = threading.Thread(target=self._run, name="torchjob-store-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            self.observe(answered(self.address, self.timeout_s, self._connect), started)
            self._stop.wait(max(0.0, self.every_s - (self._clock() - started)))
