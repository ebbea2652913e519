"""SIGTERM in a pod given notice: train on while the operator starts the replacement.

A worker pod of an elastic ``KeepSurvivors`` job with ``replaceBeforeLeaving`` carries
``TORCHJOB_DRAIN_S`` (``torchjob.rules.drain``). When the kubelet sends SIGTERM while the
pod's workers train, they go on: the operator creates the replacement at once and, once it
is Ready, publishes a generation with it in this pod's place, which stops the group at a
report and lets this pod leave (``KeepSurvivorsMode.interrupt``). Only if that has not
happened ``drain_s`` later is the stop requested, as any SIGTERM requests it without a drain
(all ranks stop at their next report). A SIGTERM outside training (a joiner waiting to join,
a survivor between generations) stops at once, and so does one that comes while the TorchJob
itself is being deleted (:meth:`Notice.final`: no replacement will come, so training on would
only delay the deletion by the drain).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Notice:
    """What a SIGTERM means for this process: stop now, or after ``drain_s`` of training."""

    def __init__(self, stop: threading.Event, drain_s: float) -> None:
        self.stop = stop
        self.drain_s = drain_s
        self.given = False
        """SIGTERM came while the workers trained, and they train on."""
        self._told = False
        self._told_final = False
        self._training = False
        self._final = False
        self._timer: threading.Timer | None = None

    @contextmanager
    def training(self) -> Iterator[None]:
        """While the workers train a SIGTERM drains; outside, it stops at once."""
        self._training = True
        try:
            yield
        finally:
            self._training = False

    def sigterm(self) -> None:
        """The SIGTERM handler (main thread): start the drain, or request the stop."""
        if self.drain_s <= 0 or not self._training or self._final or self.stop.is_set():
            self.stop.set()
            return
        if self.given:
            return
        self.given = True
        self._timer = threading.Timer(self.drain_s, self.stop.set)
        self._timer.daemon = True
        self._timer.start()

    def tell(self) -> str | None:
        """The line to log (not from the handler), once each: after a SIGTERM that drains,
        and once the job's deletion is seen in a pod that would drain (before its SIGTERM, or
        after it: the deletion ends the drain or cuts it short). Said without waiting for the
        SIGTERM: another pod's stop may end this pod's run before its own SIGTERM comes."""
        if self._final and (self.given or self.drain_s > 0):
            if self._told_final:
                return None
            self._told = self._told_final = True
            if self.stop.is_set():
                return (
                    "SIGTERM: the TorchJob is being deleted; no replacement will come, so "
                    "this pod stops at its next report instead of training on"
                )
            return (
                "the TorchJob is being deleted; no replacement will come, so a SIGTERM will "
                "stop this pod at its next report instead of training on"
            )
        if not self.given or self._told:
            return None
        self._told = True
        return (
            f"SIGTERM: this pod was given notice; its workers train on for up to "
            f"{self.drain_s:g}s while the operator starts its replacement"
        )

    def final(self) -> None:
        """The TorchJob is being deleted (any thread): a SIGTERM, before or after this, stops
        at the next report instead of draining."""
        self._final = True
        if self.given:
            self.cancel()
            self.stop.set()

    def cancel(self) -> None:
        """The run ended: no stop to request any more."""
        if self._timer is not None:
            self._timer.cancel()
