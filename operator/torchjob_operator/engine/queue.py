"""One work queue for every controller: one asyncio task per object, woken by pokes.

Every watch event only *pokes* its object's loop; the loop runs the controller's
``reconcile`` in a worker thread, at most one at a time per object, and sleeps until the
next poke or the requeue time the reconcile asked for (never longer than the resync
period). Pokes coalesce, so a burst of events is one reconcile. This is the work-queue
pattern of controller-runtime, and it needs no finalizer: deleting an object never waits
for the operator.

Loops run only while this replica leads (``leader.py``): a standby ignores pokes, and on
losing the lease every loop is cancelled and none starts again. The queue knows nothing
of what a controller decides: a controller is any object with the four methods of
``Controller``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from torchjob_operator.engine import metrics
from torchjob_operator.engine.kube import KubeError

log = logging.getLogger("torchjob_operator")

Key = tuple[str, str]
"""(namespace, name) of the object a loop reconciles."""

MAX_BACKOFF_S = 60.0
"""The longest wait after a failed reconcile (the wait doubles from 1 s per failure)."""

SLOW_S = 2.0
"""A reconcile that ends this long after the event that woke it is logged, with where the
time went (waiting for the previous reconcile or the cache, or the reconcile itself): a
survivor's silent report to the next generation took 4-10 s on the fleet bench, and
nothing said where."""


@dataclass(frozen=True)
class Result:
    """What one reconcile asks of its loop."""

    requeue_after_s: float | None = None
    """Run again after this long even if nothing happens (0: at once); None: wait for a
    poke (or the resync period)."""
    gone: bool = False
    """The object no longer exists: end its loop."""


class Controller(Protocol):
    """What the queue runs: ``reconcile`` in a worker thread, the rest on the event loop."""

    kind: str
    """What it reconciles (``torchjob``): names the loops' tasks and log lines."""

    def keys(self, namespaces: tuple[str, ...]) -> list[Key]:
        """Every object to reconcile (on becoming leader); runs in a worker thread."""
        ...

    def catching_up(self, key: Key) -> float | None:
        """Seconds to wait before planning ``key`` (its last writes are not visible yet);
        None: reconcile now."""
        ...

    def reconcile(self, namespace: str, name: str) -> Result: ...

    def forget(self, key: Key) -> None:
        """The loop of ``key`` ended: drop what the controller keeps for it."""
        ...


@dataclass
class _Loop:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    poked_at: float | None = None
    """When the first poke since the last reconcile began came (monotonic)."""


class WorkQueue:
    """One loop per key of ``controller``; ``on_drop`` runs (on the event loop) whenever a
    loop ends, by deletion or because its object is gone."""

    def __init__(
        self,
        controller: Controller,
        *,
        resync_s: float,
        leading: bool = True,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self.controller = controller
        self.resync_s = resync_s
        self.leading = leading
        self.on_drop = on_drop
        self.loops: dict[Key, _Loop] = {}

    async def start_leading(self, namespaces: tuple[str, ...]) -> None:
        """Became leader: reconcile every object, since the watch events came while standing by."""
        self.leading = True
        for key in await asyncio.to_thread(self.controller.keys, namespaces):
            self.poke(key)

    def stop_leading(self) -> None:
        self.leading = False
        for key in list(self.loops):
            self.forget(key)

    def depth(self) -> int:
        """Objects poked and not yet reconciled since (``torchjob_workqueue_depth``)."""
        return sum(1 for loop in self.loops.values() if loop.wake.is_set())

    def poke(self, key: Key) -> None:
        if not self.leading:
            return
        loop = self.loops.get(key)
        if loop is None or loop.task is None or loop.task.done():
            loop = _Loop()
            self.loops[key] = loop
            loop.task = asyncio.create_task(
                self._run(key, loop), name=f"{self.controller.kind}:{key[0]}/{key[1]}"
            )
        if loop.poked_at is None:
            loop.poked_at = time.monotonic()
        loop.wake.set()

    def forget(self, key: Key) -> None:
        """The object was deleted: end its loop."""
        loop = self.loops.pop(key, None)
        if loop and loop.task:
            loop.task.cancel()
        self._dropped(key)

    def _said_if_slow(self, key: Key, poked: float | None, began: float) -> None:
        ended = time.monotonic()
        if poked is None or ended - poked < SLOW_S:
            return
        log.info(
            "[%s/%s] %s reconcile ended %.1fs after the event that woke it (%.1fs before it "
            "began: the previous reconcile, or the cache catching up; %.1fs in it)",
            key[0],
            key[1],
            self.controller.kind,
            ended - poked,
            began - poked,
            ended - began,
        )

    def _dropped(self, key: Key) -> None:
        self.controller.forget(key)
        if self.on_drop is not None:
            self.on_drop()

    async def _run(self, key: Key, loop: _Loop) -> None:
        ns, name = key
        error_backoff = 1.0
        while self.leading:
            loop.wake.clear()
            catching_up = self.controller.catching_up(key)
            if catching_up is not None:
                # The last writes are not in the cache yet: the watch events that bring them
                # poke this loop (or the deadline passes and the next pass reads live).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(loop.wake.wait(), timeout=catching_up)
                continue
            delay: float | None
            began, poked = time.monotonic(), loop.poked_at
            loop.poked_at = None
            try:
                result = await asyncio.to_thread(self.controller.reconcile, ns, name)
                error_backoff = 1.0
                self._said_if_slow(key, poked, began)
            except Exception as exc:  # never let one object's error end the operator
                if isinstance(exc, KubeError) and exc.namespace_terminating:
                    # Not a failure: the namespace's deletion removes the object, which ends
                    # this loop (the next reconcile finds it gone).
                    log.info(
                        "[%s/%s] namespace is being deleted; nothing to create (next look in "
                        "%.0fs)",
                        ns,
                        name,
                        error_backoff,
                    )
                else:
                    metrics.RECONCILE_ERRORS.inc()
                    log.exception(
                        "[%s/%s] %s reconcile failed; retrying in %.0fs",
                        ns,
                        name,
                        self.controller.kind,
                        error_backoff,
                    )
                delay = error_backoff
                error_backoff = min(error_backoff * 2, MAX_BACKOFF_S)
            else:
                if result.gone:
                    self.loops.pop(key, None)
                    self._dropped(key)
                    return
                delay = result.requeue_after_s
                if delay == 0.0:
                    continue
            timeout = self.resync_s if delay is None else min(delay, self.resync_s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(loop.wake.wait(), timeout=timeout)


__all__ = ["Controller", "Key", "Result", "WorkQueue"]
