"""The dashboard's rate counts the loop's steps where its reports carry one, and says so."""

from __future__ import annotations

from typing import Any

from torchjob.client.dashboard import REPORTS, STEPS, Samples, job_row, progress_count


def _job(progress: dict[str, Any] | None, *, world: int = 2, phase: str = "Running") -> dict:
    return {
        "metadata": {"namespace": "ns", "name": "j"},
        "spec": {"replicas": 2},
        "status": {"phase": phase, "worldSize": world, "replicas": 2, "progress": progress},
    }


def test_the_loops_step_is_counted_where_the_reports_carry_one() -> None:
    assert progress_count({"step": 3, "metrics": {"step": 450, "loss": 0.1}}) == (450, STEPS)
    assert progress_count({"step": 3, "metrics": {"loss": 0.1}}) == (3, REPORTS)
    # A boolean or a float is no step; nothing at all is no count.
    assert progress_count({"step": 3, "metrics": {"step": True}}) == (3, REPORTS)
    assert progress_count({"step": 3, "metrics": {"step": 2.5}}) == (3, REPORTS)
    assert progress_count(None) == (None, REPORTS)


def test_a_job_reporting_once_per_checkpoint_shows_its_steps_per_second() -> None:
    """Every 15th step reported: 30 steps in 10 s is 3 steps/s, where the report count
    (2 reports in 10 s) gave 0.2 and called it steps."""
    samples = Samples()
    samples.add(_job({"step": 1, "metrics": {"step": 15}}), now=100.0)
    samples.add(_job({"step": 3, "metrics": {"step": 45}}), now=110.0)
    row = job_row(_job({"step": 3, "metrics": {"step": 45}}), samples, now=110.0)
    assert (row["stepsPerSecond"], row["rateUnit"]) == (3.0, STEPS)
    assert row["goodput"] == 1.0


def test_a_loop_that_reports_no_step_shows_reports_per_second() -> None:
    samples = Samples()
    samples.add(_job({"step": 4, "metrics": {"loss": 1.0}}), now=0.0)
    samples.add(_job({"step": 9, "metrics": {"loss": 0.5}}), now=10.0)
    rate, _ = samples.rates(("ns", "j"), now=10.0)
    assert (rate, samples.unit(("ns", "j"))) == (0.5, REPORTS)


def test_a_change_of_unit_starts_the_samples_again() -> None:
    """Reports counted first, then the loop's step: no rate across the two (it would read
    as 400 steps in 10 s)."""
    samples = Samples()
    samples.add(_job({"step": 5, "metrics": {}}), now=0.0)
    samples.add(_job({"step": 6, "metrics": {"step": 405}}), now=10.0)
    assert samples.rates(("ns", "j"), now=10.0)[0] is None
    samples.add(_job({"step": 7, "metrics": {"step": 425}}), now=20.0)
    assert samples.rates(("ns", "j"), now=20.0) == (2.0, 1.0)
    assert samples.unit(("ns", "j")) == STEPS


def test_a_shrunk_job_trains_but_not_at_full_size() -> None:
    samples = Samples()
    samples.add(_job({"step": 1, "metrics": {"step": 10}}), now=0.0)
    samples.add(_job({"step": 2, "metrics": {"step": 20}}, world=1), now=10.0)
    samples.add(_job({"step": 3, "metrics": {"step": 30}}), now=20.0)
    rate, goodput = samples.rates(("ns", "j"), now=20.0)
    assert (rate, goodput) == (1.0, 0.5)
