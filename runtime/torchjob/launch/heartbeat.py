"""Silent peers: heartbeats through the rendezvous store, and a watchdog on every rank.

A process that is killed closes its connections, and its peers' collectives fail at once.
A node that vanishes (power, a network partition, a frozen VM, a SIGSTOPped process) sends
no FIN and no RST: its peers would wait in their collective until its timeout (300 s by
default). So every rank of a formed group runs one thread that, every ``interval_s``,
writes its own beat to the generation's store (its own TCPStore client, with a short
timeout) and reads every other rank's. A rank whose beat has not moved for
``silent_after_s`` (or a store that has not answered for that long: rank 0, which serves
it, is the silent one) is *silent*: the watchdog tells the driver (a
``torchjob.launch.protocol.SilentPeer`` event), which kills the rank if it runs it
(its connections then close and the survivors' collectives fail as for any death), and,
for a rank on another host, breaks this process's own connections to the group
(:func:`break_group_connections`), so its collective fails now and the cascade of
``worker._leave_broken_group`` reaches every survivor.

``TORCHJOB_SILENT_PEER_S`` (``RuntimeSettings.silent_peer_s``) sets ``silent_after_s``
(default 3; 0 turns the watchdog off). Its keys are ``StoreLayout.heartbeat``'s. The
beats come every :func:`beat_interval_s` (0.75 s at the default), so a rank is found silent
after about four missed beats of both its sources (below). The default was 5 s until the
fleet benchmark measured how close live peers came (``Gaps``): at most 1.7 s apart on 2
shared cores running 8 pods, 4 kubelets and the control plane, and no live pod reported
silent in three rows at 3 s (bench/results/2026-12-05m). A rank that has not beaten yet
(its watchdog still connecting, as when many ranks form a group at once on a loaded host) is
given twice the threshold.
The worker's own beat is a Python thread: a call that holds the worker's GIL for long (a slow
import, a large pickle) stops it. So the driver beats for its workers too, from its own
process, while their processes run and are not stopped (``torchjob.launch.driver_beat``): a
rank's key moves while either beats, and a live rank is never found silent for its GIL.
A store silent for :func:`quiet_after` (half the threshold) is said to the driver ahead
(``protocol.StoreQuiet``): rank 0's silence hides its node-mates' (their beats went through
its store), and the driver's sweep of the members' hosts that finds them takes
``SWEEP_TIMEOUT_S``; run from then, it is done when rank 0 is found silent.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torchjob.launch.layout import StoreLayout, prefixed
from torchjob.launch.settings import WorkerEnv
from torchjob.launch.store_probe import SWEEP_TIMEOUT_S


def beat_interval_s(silent_after: float) -> float:
    """How often a rank's beat is written and its peers' read: a quarter of the threshold, at
    most 1 s (each beat is three small requests to rank 0's store, from every rank: at 32
    ranks on a small machine, twice as many slowed the store down for everybody)."""
    return min(1.0, silent_after / 4)


def store_client(
    silent_after: float,
    interval_s: float | None = None,
    connect: timedelta | None = None,
    *,
    layout: StoreLayout,
) -> Any:
    """This rank's heartbeat connection to the store (``layout``'s address): the one of
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
        layout.addr,
        layout.port,
        connect=connect or timedelta(seconds=max(1.0, silent_after / 2)),
        timeout=timedelta(seconds=max(1.0, interval_s * 2)),
        use_libuv=layout.use_libuv,
    )


def quiet_after(silent_after: float) -> float:
    """How long the store is silent before the watchdog says so ahead of finding rank 0
    silent: :data:`SWEEP_TIMEOUT_S` short of the threshold, never under half of it (1.5 s of the default 3)
    (a store a little slow under load is not worth a sweep)."""
    return max(silent_after / 2, silent_after - SWEEP_TIMEOUT_S)


class Gaps:
    """How close a watchdog came to a false alarm: for each source (a peer's rank, or
    ``"store"``), the longest time between two sightings of it (a beat that moved, an
    answer), counted only once the source is seen again, so a real loss (never seen again)
    counts for nothing. A gap includes this process's own starvation (the beat thread not
    scheduled): it bounds from above what the judge saw. Not thread-safe (the beat thread's
    own)."""

    def __init__(self) -> None:
        self._last: dict[int | str, float] = {}
        self.longest: dict[int | str, float] = {}

    def seen(self, source: int | str, now: float) -> None:
        before = self._last.get(source)
        if before is not None and now - before > self.longest.get(source, 0.0):
            self.longest[source] = now - before
        self._last[source] = now

    def closest(self) -> tuple[int | str, float] | None:
        """The source whose gap was the longest, and that gap; None before any gap."""
        return max(self.longest.items(), key=lambda kv: kv[1], default=None)


def near_miss(gaps: Gaps, silent_after: float, rank: int, generation: int) -> str | None:
    """A line for the job's log when a live source's gap passed half the threshold: the
    watchdog came that close to finding a live peer silent (a loaded host, a slow network).
    None otherwise."""
    closest = gaps.closest()
    if closest is None or closest[1] <= silent_after / 2:
        return None
    source, gap = closest
    what = "the store's answers" if source == "store" else f"rank {source}'s beats"
    return (
        f"[torchjob] rank {rank}'s watchdog, generation {generation}: {what} came {gap:.1f}s "
        f"apart, {gap / silent_after:.0%} of the {silent_after:g}s after which a peer is "
        "silent (TORCHJOB_SILENT_PEER_S); raise it if live pods are ever reported silent"
    )


class Watchdog:
    """One rank's heartbeat and watchdog for one generation: two daemon threads.

    The *beat* thread writes this rank's beat and reads the others' through the store. The
    *judge* thread never touches the store: it reads what the beat thread last saw. The split
    is what finds a silent rank 0: a ``TCPStore`` client request to a server that is frozen
    or whose packets are dropped can block for ever whatever its timeout (measured with
    torch 2.15: ``check``, ``get`` and ``wait`` wait for a reply after their own timeout
    lapses; only ``set``, which expects none, returns), so a single thread that asked the
    store and judged its answer never judged again. The judge sees the beat thread's last
    answer age past ``silent_after`` and declares rank 0, which serves the store.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_ranks: range,
        on_silent: Callable[[int, float], None],
        silent_after: float,
        on_quiet: Callable[[float], None] | None = None,
        break_group: Callable[[], object] = lambda: None,
        interval_s: float | None = None,
        layout: StoreLayout,
    ) -> None:
        self.rank = rank
        self.layout = layout
        """The generation's store and keys (``torchjob.launch.layout``)."""
        self.world_size = world_size
        self.local_ranks = local_ranks
        self.on_silent = on_silent
        self.silent_after = silent_after
        self.on_quiet = on_quiet
        """Told once, :func:`quiet_after` into the store's silence, how long it has lasted
        (``protocol.StoreQuiet``): the driver starts its sweep of the members' hosts then."""
        self.quiet_after = quiet_after(silent_after)
        self._quiet_said = False
        self.break_group = break_group
        """Fails this rank's collective on a silent peer of another host: closes the group's
        own connections, never the process's others (the user's object store, tracking or
        database connections stay up)."""
        self.interval_s = interval_s or beat_interval_s(silent_after)
        self._stop = threading.Event()
        self._declared: set[int] = set()
        self._lock = threading.Lock()
        self._others = [r for r in range(world_size) if r != rank]
        now = time.monotonic()
        # A rank not seen yet is judged from a threshold later: its own watchdog may still
        # be connecting (a whole group connects at once), and its driver's beat may be too.
        self._last_seen = dict.fromkeys(self._others, now + silent_after)
        self._last_value: dict[int, bytes] = {}
        self._store_ok = now + silent_after
        """When the store last answered (or, before its first answer, when the grace ends)."""
        self.gaps = Gaps()
        """The beat thread's record of how close a live source came to the threshold,
        written to the job's log at :meth:`stop` when past half of it (:func:`near_miss`)."""
        self._threads = [
            threading.Thread(target=self._beat_loop, name="torchjob-heartbeat", daemon=True),
            threading.Thread(target=self._judge_loop, name="torchjob-watchdog", daemon=True),
        ]

    def start(self) -> Watchdog:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            line = near_miss(self.gaps, self.silent_after, self.rank, self.layout.generation)
        if line is not None:
            print(line, file=sys.stderr, flush=True)

    def _store(self) -> Any:
        store = store_client(self.silent_after, self.interval_s, layout=self.layout)
        return prefixed(self.layout.heartbeat, store)

    def _beat_loop(self) -> None:
        """Beat and read the others' beats; may block for ever in a request to a frozen
        store (the judge then finds rank 0 silent; this thread dies with the process)."""
        store = None
        beat = 0
        keys = [str(r) for r in self._others]
        while not self._stop.wait(self.interval_s):
            try:
                if store is None:  # a rank that never beats would be found silent
                    store = self._store()
                beat += 1
                store.set(str(self.rank), str(beat))
                if store.check(keys):  # the usual case: one request for every key
                    present = self._others
                else:  # some rank has not beaten yet (it is still starting its thread)
                    present = [
                        r for r, k in zip(self._others, keys, strict=True) if store.check([k])
                    ]
                values = store.multi_get([str(r) for r in present]) if present else []
            except Exception:
                continue  # the store's silence is judged by the judge, from _store_ok
            now = time.monotonic()
            with self._lock:
                self._store_ok = max(self._store_ok, now)
                self.gaps.seen("store", now)
                for r, v in zip(present, values, strict=True):
                    if self._last_value.get(r) != v:
                        self._last_value[r] = v
                        self._last_seen[r] = max(self._last_seen[r], now)
                        self.gaps.seen(r, now)

    def _judge_loop(self) -> None:
        # The judge asks nothing of the store: it looks four times a beat, so a silence is
        # declared within a quarter beat of passing the threshold, not up to a whole beat
        # after (the fleet benchmark's reports said 5.0-6.0 s for a 5 s threshold).
        every = self.interval_s / 4
        waited_from = time.monotonic()
        while not self._stop.wait(every):
            now = time.monotonic()
            with self._lock:
                if now - waited_from - every > self.silent_after / 2:
                    # The wait itself overran: this process was starved (a loaded machine,
                    # a stopped debugger) and cannot tell a silent peer from its own
                    # silence, so it judges afresh.
                    self._last_seen = dict.fromkeys(self._others, now)
                    self._store_ok = now
                store_silent = now - self._store_ok
                peers_silent = {r: now - t for r, t in self._last_seen.items()}
            waited_from = now
            if store_silent > self.silent_after:
                # Every other rank's beat goes through the store too: only rank 0, which
                # serves it, can be judged while it does not answer.
                if self.rank != 0:
                    self._declare({0: store_silent})
                continue
            if store_silent > self.quiet_after and self.rank != 0:
                self._say_quiet(store_silent)
            if any(s > self.silent_after for s in peers_silent.values()):
                # A node that vanishes silences its ranks within a beat of each other, and
                # the first declaration ends this generation: those quiet for more than half
                # the threshold (two beats at least; a live rank's beat is one old at most)
                # go with it, or they would be members of the next generation, found again
                # a threshold (and a re-formation) later.
                near = max(2 * self.interval_s, self.silent_after / 2)
                self._declare({r: s for r, s in peers_silent.items() if s > near})

    def _say_quiet(self, quiet_s: float) -> None:
        if self._quiet_said or self.on_quiet is None or self._stop.is_set():
            return
        self._quiet_said = True
        with contextlib.suppress(Exception):
            self.on_quiet(quiet_s)

    def _declare(self, silent: dict[int, float]) -> None:
        """Report every rank of ``silent`` (rank: seconds) not reported yet, then break the
        group once. All of them first: a node that vanishes silences several ranks at once,
        and breaking the group ends this watchdog's generation, so a rank judged after the
        break was never reported (seen: one of a vanished node's 4 pods reported, the other 3
        kept as members of the next generation until the node came back)."""
        new = {r: s for r, s in silent.items() if r not in self._declared}
        if not new or self._stop.is_set():
            return
        self._declared.update(new)
        if 0 in new:
            from torchjob.launch import store_clients

            # Nobody may reuse a connection to a store that went silent.
            store_clients.discard("heartbeat", *_store_address())
        for rank, silent_s in sorted(new.items()):
            with contextlib.suppress(Exception):
                self.on_silent(rank, silent_s)
        if set(new) - set(self.local_ranks):
            # The driver cannot kill a rank on another host: fail this rank's collective.
            with contextlib.suppress(Exception):
                self.break_group()


def _store_address() -> tuple[str, int]:
    env = WorkerEnv.from_env()  # this worker's, as of its current generation
    return env.master_addr, env.master_port


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


def break_group_connections(only: frozenset[int], keep_fds: frozenset[int] = frozenset()) -> int:
    """Shut down this process's TCP connections among ``only`` (inodes: the group's own,
    taken with :func:`socket_inodes` around its formation: gloo's pairs) except the store's
    (to or from ``MASTER_PORT``) and ``keep_fds`` (the driver's), so a collective blocked on
    a silent peer fails now. Never any other connection of the process: a user's object
    store, tracking or database connection stays up. Returns how many were shut down. Linux
    only (``/proc``)."""
    store_port = _store_address()[1]
    keep = set(keep_fds)
    return sum(
        _shutdown(fd, store_port)
        for inode, fd in _socket_inodes().items()
        if inode in only and fd not in keep
    )
