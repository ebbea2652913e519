"""The driver's heartbeat for its workers: a beat no worker's GIL can silence.

Every rank's watchdog (``torchjob.launch.heartbeat``) declares a peer silent when its beat
in the generation's store has not moved for ``TORCHJOB_SILENT_PEER_S``. A worker's own beat
is a Python thread of the worker: a call that holds the worker's GIL for long (a slow
import, a large pickle, a C extension that does not release it) stops it, although the
process is alive. So the driver (the pod's ``fit()``, a laptop's driver) beats too, from a
thread of its own process, for each of its workers whose process runs: it knows that from
the kernel (``/proc/<pid>/stat``: not exited, not stopped), not from the worker's Python.
A worker's key moves while either beats: a live worker stays live whatever its GIL does,
and a worker stopped (SIGSTOP, a frozen process) or gone, or a pod whose network is gone
(the driver's beats no longer reach the store), goes silent within the threshold. The
driver's own GIL is free nearly always: it waits on its workers' connections.

The driver beats only where torch is already imported (its ``TCPStore`` client): a driver
that never imported torch leaves the beat to the workers, as before.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from torchjob.launch.heartbeat import beat_interval_s
from torchjob.launch.layout import StoreLayout, prefixed


def process_runs(pid: int) -> bool:
    """The process exists and is neither stopped (SIGSTOP, a debugger) nor a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # no /proc (macOS): it exists
        except OSError:
            return False
        return True
    return state not in ("T", "t", "Z", "X", "x")


class DriverBeat:
    """Beats for the ranks this driver runs (``{rank: pid}``), in the generation's store."""

    def __init__(
        self,
        *,
        layout: StoreLayout,
        ranks: Mapping[int, int],
        interval_s: float,
    ) -> None:
        self.layout = layout
        self.ranks = dict(ranks)
        self.interval_s = interval_s
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchjob-driver-beat", daemon=True)

    @classmethod
    def for_group(cls, group: Any, workers: Any) -> DriverBeat | None:
        """A started beat for ``workers`` of ``group`` (a formed ``WorkerGroup`` of more than one
        rank), or None where the driver does not beat (see the module docstring)."""
        after = group.settings.silent_peer_s
        placement = group.placement
        if after <= 0 or not group.formed or placement.world_size == 1:
            return None
        if "torch.distributed" not in sys.modules:
            return None
        beat = cls(
            layout=group.store_layout(),
            ranks={w.rank: w.proc.pid for w in workers},
            interval_s=beat_interval_s(after),
        )
        beat._thread.start()
        return beat

    def stop(self) -> None:
        """Stop beating; the thread ends within moments (a daemon: never waited for long)."""
        self._stop.set()
        self._thread.join(timeout=0.2)

    def _store(self) -> Any:
        from torchjob.launch import store_clients

        timeout = timedelta(seconds=max(1.0, self.interval_s * 2))
        layout = self.layout
        store = store_clients.client(
            "driver-beat",
            layout.addr,
            layout.port,
            connect=timeout,
            timeout=timeout,
            use_libuv=layout.use_libuv,
        )
        return prefixed(layout.heartbeat, store)

    def _run(self) -> None:
        store: Any = None
        while not self._stop.wait(self.interval_s):
            if store is None:
                try:
                    store = self._store()
                except Exception:
                    continue  # the store is not up yet, or unreachable: try again
            self.beats += 1
            try:
                for rank, pid in self.ranks.items():
                    if process_runs(pid):
                        store.set(StoreLayout.beat_key(rank), f"d{self.beats}")
            except Exception:
                from torchjob.launch import store_clients

                store_clients.discard("driver-beat", self.layout.addr, self.layout.port)
                store = None
