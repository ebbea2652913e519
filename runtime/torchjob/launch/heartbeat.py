"""Silent peers: heartbeats through the rendezvous store, and a watchdog on every rank.

A process that is killed closes its connections, and its peers' collectives fail at once.
A node that vanishes (power, a network partition, a frozen VM, a SIGSTOPped process) sends
no FIN and no RST: its peers would wait in their collective until its timeout (300 s by
default). So every rank of a formed group runs one thread that, every ``interval_s``,
writes its own beat to the generation's store (its own TCPStore client, with a short
timeout) and reads every other rank's. A rank whose beat has not moved for
``silent_after_s`` (or a store that has not answered for that long: rank 0, which serves
it, is the silent one) is *silent*: the watchdog tells the driver (an event,
``{"type": "silent_peer", "rank": r, "silent_s": s}``), which kills the rank if it runs it
(its connections then close and the survivors' collectives fail as for any death), and,
for a rank on another host, breaks this process's own connections to the group
(:func:`break_group_connections`), so its collective fails now and the cascade of
``worker._leave_broken_group`` reaches every survivor.

``TORCHJOB_SILENT_PEER_S`` sets ``silent_after_s`` (default 5; 0 turns the watchdog off). The
beats come every :func:`beat_interval_s` (1 s at the default), so a rank is found silent
after about five missed beats of both its sources (below). A rank that has not beaten yet
(its watchdog still connecting, as when many ranks form a group at once on a loaded host) is
given twice the threshold.
The worker's own beat is a Python thread: a call that holds the worker's GIL for long (a slow
import, a large pickle) stops it. So the driver beats for its workers too, from its own
process, while their processes run and are not stopped (``torchjob.launch.driver_beat``): a
rank's key moves while either beats, and a live rank is never found silent for its GIL.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

ENV_SILENT_PEER_S = "TORCHJOB_SILENT_PEER_S"
DEFAULT_SILENT_PEER_S = 5.0


def beat_interval_s(silent_after: float) -> float:
    """How often a rank's beat is written and its peers' read: a quarter of the threshold, at
    most 1 s (each beat is three small requests to rank 0's store, from every rank: at 32
    ranks on a small machine, twice as many slowed the store down for everybody)."""
    return min(1.0, silent_after / 4)


def silent_after_s() -> float:
    raw = os.environ.get(ENV_SILENT_PEER_S, "")
    try:
        return float(raw) if raw else DEFAULT_SILENT_PEER_S
    except ValueError:
        raise ValueError(f"{ENV_SILENT_PEER_S}={raw!r} is not a number of seconds") from None


def store_client(
    silent_after: float, interval_s: float | None = None, connect: timedelta | None = None
) -> Any:
    """This rank's heartbeat connection to the store (``MASTER_ADDR:MASTER_PORT``): the one of
    the generation before where it still answers (``torchjob.launch.store_clients``). Its
    requests time out fast (two beats). Connecting may take long where many ranks connect at
    once on a loaded host (the store serves their rendezvous first), so the worker connects it
    ahead, beside its rendezvous (``connect``: the rendezvous timeout); the watchdog itself
    tries for up to half the threshold, and again until connected (a rank that never beats
    would be found silent)."""
    from torchjob.launch import store_clients

    interval_s = interval_s or beat_interval_s(silent_after)
    return store_clients.client(
        "heartbeat",
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        connect=connect or timedelta(seconds=max(1.0, silent_after / 2)),
        timeout=timedelta(seconds=max(1.0, interval_s * 2)),
    )


class Watchdog:
    """One rank's heartbeat and watchdog for one generation (a daemon thread)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_ranks: range,
        on_silent: Callable[[int, float], None],
        silent_after: float,
        interval_s: float | None = None,
        keep_fds: frozenset[int] = frozenset(),
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_ranks = local_ranks
        self.on_silent = on_silent
        self.silent_after = silent_after
        self.keep_fds = keep_fds
        """Connections :func:`break_group_connections` leaves alone (the driver's)."""
        self.interval_s = interval_s or beat_interval_s(silent_after)
        self._stop = threading.Event()
        self._declared: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="torchjob-heartbeat", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _store(self) -> Any:
        import torch.distributed as dist

        store = store_client(self.silent_after, self.interval_s)
        generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"torchjob/g{generation}/hb", store)  # type: ignore[attr-defined]

    def _run(self) -> None:
        store = None
        while store is None:  # a rank that never beats would be found silent: keep trying
            try:
                store = self._store()
            except Exception:
                if self._stop.wait(self.interval_s):
                    return
        others = [r for r in range(self.world_size) if r != self.rank]
        keys = [str(r) for r in others]
        start = time.monotonic()
        last_value: dict[int, bytes] = {}
        # A rank not seen yet is judged from a threshold later: its own watchdog may still
        # be connecting (a whole group connects at once), and its driver's beat may be too.
        last_seen = dict.fromkeys(others, start + self.silent_after)
        store_ok = previous = start
        beat = 0
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - previous > self.silent_after / 2:
                # This thread itself was starved (a loaded machine, a stopped debugger): it
                # cannot tell a silent peer from its own silence, so it judges afresh.
                last_seen = dict.fromkeys(others, now)
                store_ok = now
            previous = now
            beat += 1
            try:
                store.set(str(self.rank), str(beat))
                if store.check(keys):  # the usual case: one request for every key
                    present = others
                else:  # some rank has not beaten yet (it is still starting its thread)
                    present = [r for r, k in zip(others, keys, strict=True) if store.check([k])]
                values = store.multi_get([str(r) for r in present]) if present else []
                store_ok = now
            except Exception:
                values, present = [], []
                if now - store_ok > self.silent_after and self.rank != 0:
                    self._declare(0, now - store_ok)  # rank 0 serves the store
                continue
            for r, v in zip(present, values, strict=True):
                if last_value.get(r) != v:
                    last_value[r] = v
                    last_seen[r] = now
            for r in others:
                if now - last_seen[r] > self.silent_after:
                    self._declare(r, now - last_seen[r])

    def _declare(self, rank: int, silent_s: float) -> None:
        if rank in self._declared or self._stop.is_set():
            return
        self._declared.add(rank)
        with contextlib.suppress(Exception):
            self.on_silent(rank, silent_s)
        if rank not in self.local_ranks:
            # The driver cannot kill a rank on another host: fail this rank's collective.
            break_group_connections(self.keep_fds)


# --- breaking this process's connections to a group whose peer went silent ---------------


def _socket_inodes() -> dict[int, int]:
    """This process's socket file descriptors by inode."""
    out: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:["):
                out[int(target[8:-1])] = int(name)
    return out


def _tcp_connections() -> dict[int, tuple[int, int]]:
    """Established TCP connections of this network namespace: inode -> (local, remote port)."""
    out: dict[int, tuple[int, int]] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                parts = line.split()
                if len(parts) < 10 or parts[3] != "01":  # 01: ESTABLISHED
                    continue
                local_port = int(parts[1].rsplit(":", 1)[1], 16)
                remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                out[int(parts[9])] = (local_port, remote_port)
    return out


def socket_inodes() -> frozenset[int]:
    """This process's sockets now (their inodes): taken around a group's formation, the
    difference is the group's own connections (see :func:`break_group_connections`)."""
    try:
        return frozenset(_socket_inodes())
    except OSError:  # no /proc (not Linux)
        return frozenset()


def _shutdown(fd: int, store_port: int) -> bool:
    with contextlib.suppress(OSError):
        s = socket.socket(fileno=os.dup(fd))
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                return False
            if store_port in (s.getsockname()[1], s.getpeername()[1]):
                return False
            s.shutdown(socket.SHUT_RDWR)
            return True
        finally:
            s.close()
    return False


def break_group_connections(
    keep_fds: frozenset[int] = frozenset(), only: frozenset[int] | None = None
) -> int:
    """Shut down this process's established TCP connections except the store's (to or from
    ``MASTER_PORT``) and ``keep_fds`` (the driver's): gloo's pairs, so a collective blocked
    on a silent peer fails now. ``only``: just these sockets (inodes; the group's own, taken
    with :func:`socket_inodes` around its formation), else every one. Returns how many were
    shut down. Linux only (``/proc``)."""
    store_port = int(os.environ.get("MASTER_PORT", "0"))
    keep = set(keep_fds)
    fds = _socket_inodes()
    if only is not None:
        return sum(
            _shutdown(fd, store_port)
            for inode, fd in fds.items()
            if inode in only and fd not in keep
        )
    n = 0
    for inode, (local_port, remote_port) in _tcp_connections().items():
        fd = fds.get(inode)
        if fd is None or fd in keep or store_port in (local_port, remote_port):
            continue
        with contextlib.suppress(OSError):
            s = socket.socket(fileno=os.dup(fd))
            try:
                s.shutdown(socket.SHUT_RDWR)
                n += 1
            finally:
                s.close()
    return n
