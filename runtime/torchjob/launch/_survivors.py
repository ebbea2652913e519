"""Keeping the survivors of a lost rank: the part of ``WorkerGroup`` that drops dead
processes, starts new ones unformed and renumbers the local ranks (:meth:`heal`), so that a
``reform`` forms the next generation in the same processes (``torchjob.launch.group``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket

from torchjob.launch import nccl
from torchjob.launch.errors import LaunchError
from torchjob.launch.execution import WorkerHandle
from torchjob.launch.group_state import GroupState
from torchjob.launch.placement import Placement
from torchjob.launch.protocol import Init
from torchjob.launch.settings import RuntimeSettings
from torchjob.launch.startup import accept_workers, await_ready


class Survivors:
    """``WorkerGroup``'s survivor keeping (a mixin: it holds the group's fields)."""

    _workers: list[WorkerHandle]
    _backend: str
    _num_workers: int
    _placement: Placement
    _server: socket.socket | None
    _token: str
    _init: Init | None
    _start_timeout_s: float
    settings: RuntimeSettings
    state: GroupState

    def _spawn(self, local_rank: int, token: str) -> WorkerHandle:
        raise NotImplementedError

    def lost(self) -> list[int]:
        """Local ranks whose process is gone."""
        return [w.local_rank for w in self._workers if w.conn is None or w.proc.poll() is not None]

    def survivable(self) -> bool:
        """After a failed execution: some processes live on, and can re-form in place
        (:meth:`heal`): a gloo group whose failures were only deaths and broken connections
        (no rank hung, none raised an error of its own)."""
        alive = len(self._workers) - len(self.lost())
        in_place = nccl.in_place(self._backend, self.settings)
        return self.state.keeps_processes and in_place and alive > 0

    def heal(self, num_workers: int) -> None:
        """Keep the survivors after a lost rank: drop the dead processes, start new ones
        (unformed) up to ``num_workers`` or drop the last survivors down to it, and renumber
        the local ranks (survivors first, in rank order). :meth:`reform` then forms the next
        group in these processes. Raises :class:`WorkerGroupStartError` when a new process
        does not start (the group is then broken: shut it down)."""
        if not self.survivable():
            raise LaunchError("this worker group has no survivors to keep; start a new one")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not self.heals_to(num_workers):
            raise LaunchError("an NCCL group re-forms in place at its own size only")
        lost = self.lost()
        alive = [w for w in self._workers if w.local_rank not in lost]
        for w in [w for w in self._workers if w.local_rank in lost] + alive[num_workers:]:
            self._reap(w)  # the dead, and the last survivors of a shrink beyond the losses
        alive = alive[:num_workers]
        if self._backend == "nccl":  # a survivor keeps its slot (its GPU, its model on it)
            slots = lost  # a replacement takes a lost rank's slot
        else:
            for i, w in enumerate(alive):
                w.local_rank = i
            slots = list(range(len(alive), num_workers))
        self._num_workers = num_workers
        self._placement = Placement.local(num_workers, generation=self._placement.generation)
        self.state = self.state.healed()
        new = [self._spawn(i, self._token) for i in slots]
        self._workers = sorted(alive + new, key=lambda w: w.local_rank)
        if not new:
            return
        try:
            assert self._server is not None
            accept_workers(
                self._server, self._workers, self._token, timeout_s=self._start_timeout_s
            )
            assert self._init is not None
            for w in new:
                assert w.conn is not None
                w.conn.send(dataclasses.replace(self._init, form=False))
            await_ready(new, timeout_s=self._start_timeout_s)
        except BaseException:
            self.state = self.state.errored()
            raise

    def heals_to(self, num_workers: int) -> bool:
        """Whether :meth:`heal` can make this group ``num_workers`` strong: an NCCL group only
        at its own size (its survivors keep their GPUs)."""
        return self._backend != "nccl" or num_workers == self._num_workers

    def _reap(self, w: WorkerHandle) -> None:
        """Kill the worker's session (it and what it started), wait for it, drop its line."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
        if w.conn is not None:
            w.conn.close()
            w.conn = None
