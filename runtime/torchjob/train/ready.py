"""A joiner's readiness, as the kubelet's probe reads it.

A joiner pod (an elastic job's replacement, created ahead of its generation) is Ready once
its runtime has started and waits to join: the operator grows the job back only to ready
joiners. :class:`JoinerReady` says so in two ways: the file ``contract.JOINER_READY_FILE``
(for a probe a user wrote against it) and a TCP port, ``contract.JOINER_READY_PORT``, that
accepts connections from then on: the probe the operator gives joiner pods (a ``tcpSocket``
probe, which the kubelet runs in its own process).

Why not an ``exec`` probe on the file, as before: the kubelet runs an exec probe through the
container runtime, a ``runc exec`` of a new process in the container, every period for the
pod's whole life (a readiness probe does not stop at Ready), and after a few losses every
pod of an elastic job is a former joiner. On the fleet benchmark's 2 cores those processes
took CPU from the training pods' steps (bench/results/2026-12-06f).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from pathlib import Path

from torchjob.contract import JOINER_READY_FILE, JOINER_READY_PORT

log = logging.getLogger(__name__)


class JoinerReady:
    """Touch ``file`` and, when ``port`` is given, listen on it (every address), accepting
    and closing each connection in a daemon thread. :meth:`set` is idempotent; a port that
    cannot be bound is said once in the log (the probe then never passes: the operator's
    joiner stays unready and is replaced like any joiner that never starts)."""

    def __init__(self, file: Path = Path(JOINER_READY_FILE), port: int | None = None) -> None:
        self.file = file
        self.port = port
        self._sock: socket.socket | None = None
        self._tried = False

    @classmethod
    def probed(cls) -> JoinerReady:
        """A pod's: the file and the port of the operator's probe."""
        return cls(Path(JOINER_READY_FILE), JOINER_READY_PORT)

    def set(self) -> None:
        with contextlib.suppress(OSError):
            self.file.touch()
        if self.port is None or self._tried:
            return
        self._tried = True
        try:
            sock = _listen(self.port)
        except OSError as e:
            log.warning(
                "torchjob: the joiner's readiness port %d cannot be bound (%s): this pod "
                "never reads Ready to the operator",
                self.port,
                e,
            )
            return
        self._sock = sock
        threading.Thread(target=self._serve, args=(sock,), daemon=True, name="ready").start()

    @property
    def bound(self) -> int | None:
        """The port listened on (``port`` 0 picks a free one), or None."""
        return self._sock.getsockname()[1] if self._sock is not None else None

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed
                return
            conn.close()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept()
            self._sock.close()
            self._sock = None


def _listen(port: int) -> socket.socket:
    """A listening socket on every address: IPv6 and IPv4 where the kernel has both."""
    if socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port), family=socket.AF_INET)


__all__ = ["JoinerReady"]
