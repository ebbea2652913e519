"""``torchjob.train.teardown``: a slow end of a run is said, with where its time went; a quick
one says nothing. The clock is a fake one: each call moves it by a step's given cost."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from torchjob.train import teardown


class Clock:
    """Time that moves only when a step says how long it took."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def costs(self, seconds: float) -> Callable[[], None]:
        def step() -> None:
            self.now += seconds

        return step


def test_a_slow_teardown_names_every_step_with_its_time(capsys: pytest.CaptureFixture[str]) -> None:
    clock, ran = Clock(), []
    teardown.run_steps(
        clock=clock,
        workers=clock.costs(2.5),
        tracking=lambda: ran.append("tracking"),
        job_status=clock.costs(0.3),
    )
    assert ran == ["tracking"]
    err = capsys.readouterr().err
    assert err == (
        "[torchjob] the run's teardown took 2.8s (workers 2.5s, tracking 0.0s, job_status 0.3s)\n"
    )


def test_a_quick_teardown_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    teardown.run_steps(clock=clock, workers=clock.costs(1.0), tracking=clock.costs(0.9))
    assert capsys.readouterr().err == ""


def test_a_step_that_raises_ends_the_teardown_and_what_ran_is_still_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock, ran = Clock(), []

    def broken() -> None:
        clock.now += 3.0
        raise RuntimeError("tracking server gone")

    with pytest.raises(RuntimeError, match="tracking server gone"):
        teardown.run_steps(
            clock=clock, tracking=broken, job_status=lambda: ran.append("job status")
        )
    assert ran == []
    assert capsys.readouterr().err == "[torchjob] the run's teardown took 3.0s (tracking 3.0s)\n"


@pytest.mark.parametrize(("step_s", "said"), [(5.0, True), (1.0, False)])
def test_the_exit_after_a_stop_is_said_only_when_it_came_late(step_s: float, said: bool) -> None:
    """In a real interpreter: the handler runs at its exit (the fake clock moves ``step_s``
    per call: once at the stop, once at the exit)."""
    code = (
        "import itertools\n"
        "from torchjob.train import teardown\n"
        f"ticks = itertools.count(0.0, {step_s})\n"
        "teardown.say_exit_after_stop(clock=lambda: next(ticks))\n"
        "raise SystemExit(75)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 75, done.stderr
    line = f"[torchjob] the process reached its exit {step_s:.1f}s after training stopped\n"
    assert done.stderr == (line if said else "")
