"""Where a run's end goes, said when it is slow.

A pod that stops (a notice, a drain, a membership change that replaces it) is paid for until
its container is gone, beside the replacement that took its place. On the fleet benchmark a
leaver's container ended 3-15 s after "training stopped on request", and none of the waits
logged so far (worker processes, the zygote, store requests) was slow. These two lines say
where the rest goes: ``run_steps`` times the steps of a run's own teardown, and
``say_exit_after_stop`` how long after the stop the interpreter reached its exit (what the
container needs after that is the interpreter's finalization and the kubelet's).
"""

from __future__ import annotations

import atexit
import sys
import time
from collections.abc import Callable

from torchjob.launch.settings import SLOW_EXIT_S

Clock = Callable[[], float]


def run_steps(
    *, clock: Clock = time.monotonic, slow_s: float = SLOW_EXIT_S, **steps: Callable[[], object]
) -> None:
    """Run ``steps`` (name=call) in order; when they took more than ``slow_s`` together, one
    line on stderr names each step's time. A step that raises ends the teardown there, as a
    plain sequence of calls would; what ran is still said."""
    took: list[tuple[str, float]] = []
    t0 = clock()
    try:
        for name, step in steps.items():
            started = clock()
            try:
                step()
            finally:
                took.append((name, clock() - started))
    finally:
        total = clock() - t0
        if total > slow_s:
            parts = ", ".join(f"{name} {s:.1f}s" for name, s in took)
            print(f"[torchjob] the run's teardown took {total:.1f}s ({parts})", file=sys.stderr)
            sys.stderr.flush()


def say_exit_after_stop(*, clock: Clock = time.monotonic, slow_s: float = SLOW_EXIT_S) -> None:
    """From now (the run stopped on request), say at the interpreter's exit how long it took
    to get there when that was more than ``slow_s``. Registered last, the handler runs first
    among the exit handlers, so it times the exception's way out of the user's script and the
    wait for its threads, not the other handlers (which say their own slow waits)."""
    stopped = clock()

    def say() -> None:
        if (took := clock() - stopped) > slow_s:
            print(
                f"[torchjob] the process reached its exit {took:.1f}s after training stopped",
                file=sys.stderr,
            )
            sys.stderr.flush()

    atexit.register(say)


__all__ = ["run_steps", "say_exit_after_stop"]
