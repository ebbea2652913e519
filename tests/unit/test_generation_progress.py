"""What rank 0's driver writes into ``status.progress`` while a generation trains
(``torchjob.train.generation.GenerationRun``): the run's report number, whichever pod's
driver it is."""

from __future__ import annotations

from typing import Any

from torchjob.launch.policy import RunState
from torchjob.launch.protocol import Report, RestoredFromMemory
from torchjob.train.generation import GenerationRun
from torchjob.train.progress import ProgressView
from torchjob.train.recovery.survivors import RestorePoints


class Record:
    """A driver's run record that has seen no report: its pod was not rank 0 before."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.last_metrics: dict[str, Any] | None = None

    def report(self, metrics: dict[str, Any]) -> None:
        self.history.append(metrics)
        self.last_metrics = metrics


class Status:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def report(self, body: dict[str, Any], urgent: bool = False) -> None:
        self.bodies.append(body)


class Tracking:
    def event(self, event: object) -> None:
        pass


class Fit:
    def __init__(self) -> None:
        self.record, self.job_status, self.tracking = Record(), Status(), Tracking()
        self.storage = None


def report(number: int) -> Report:
    return Report(
        metrics={"loss": 0.5},
        checkpoint_path=None,
        checkpoint_index=None,
        checkpoint_pending=False,
        world_size=8,
        generation=3,
        report=number,
        restore_point=True,
        restore_point_bytes=1,
    )


def test_a_pod_that_becomes_rank_0_reports_the_runs_step_not_its_own_count() -> None:
    """2026-11-29i: rank 0 moved to a pod whose driver had seen no report; the generation
    restored report 147 from the survivors' memory, and the status said it restored step 0
    and redid 147 steps (the Recovered Event too). The step is the run's report number."""
    fit = Fit()
    run = GenerationRun(
        fit,  # type: ignore[arg-type]
        RunState(num_workers=8, generation=3),
        ProgressView(enabled=False, total_epochs=None),
        points=RestorePoints(),
        generation=3,
    )
    run.on_event(0, RestoredFromMemory(index=147, source_rank=3, seconds=1.2, bytes=1))
    run.on_event(0, report(148))
    run.on_event(0, report(149))
    first, second = fit.job_status.bodies
    assert (first["step"], first["restoredFrom"], first["restoredStep"]) == (148, "memory", 147)
    assert (second["step"], second["restoredStep"]) == (149, 147)
    assert first["generation"] == 3
