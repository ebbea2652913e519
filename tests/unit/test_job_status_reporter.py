"""The progress reporter keeps the last checkpoint in every body it sends: a study's best
trial points at it, and a report's own body may not name it (its background commit lands
before or after the report's event)."""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.train.job_status import JobStatusReporter, newer_checkpoint


class Recorder:
    """Where the bodies go (the reporter's coalescing is under test, not the API server)."""

    url = "https://api/status"

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert method == "PATCH" and body is not None
        self.bodies.append(body["status"]["progress"])
        return {}


def test_a_body_without_the_checkpoint_never_drops_it() -> None:
    sink = Recorder()
    reporter = JobStatusReporter(sink, min_interval_s=60.0)  # type: ignore[arg-type]
    reporter.report({"step": 5, "lastCheckpoint": "/r/checkpoint_000005"})
    reporter.report({"step": 6})  # replaces the one above before it is sent
    reporter.report({"step": 6, "lastCheckpoint": "/r/checkpoint_000004"})  # an older one
    reporter.close(timeout_s=10)
    last = dict(sink.bodies[-1])
    assert last.pop("lastCheckpointTime").endswith("Z"), "when the checkpoint was seen"
    assert last == {"step": 6, "lastCheckpoint": "/r/checkpoint_000005"}


def test_checkpoints_are_ordered_by_their_index() -> None:
    assert newer_checkpoint("/r/checkpoint_000010", "/r/checkpoint_000009")
    assert not newer_checkpoint("/r/checkpoint_000004", "/r/checkpoint_000005")
    assert newer_checkpoint("s3://b/other/checkpoint_000001", "s3://b/r/checkpoint_000005")


def test_a_generations_first_report_goes_at_once_with_its_facts() -> None:
    from tests.kube import wait_for

    from torchjob.launch.protocol import RestoredFromMemory
    from torchjob.train.job_status import GenerationFacts

    sink = Recorder()
    reporter = JobStatusReporter(sink, min_interval_s=600.0)  # type: ignore[arg-type]
    reporter.report({"step": 1})  # the first write of the reporter goes at once
    wait_for(lambda: len(sink.bodies) == 1, 10, "the first write")
    facts = GenerationFacts(3)
    restored = RestoredFromMemory(index=7, source_rank=1, seconds=0.1, bytes=10)
    body, first = facts.add({"step": 8}, reports=8, restored=restored)
    assert first and body["generation"] == 3 and body["restoredFrom"] == "memory"
    assert body["restoredStep"] == 7 and body["firstStepTime"].endswith("Z")
    reporter.report(body, urgent=first)
    # Without urgent it would wait out the 600 s pause.
    wait_for(lambda: len(sink.bodies) == 2, 10, "the generation's first report, at once")
    later, again = facts.add({"step": 9}, reports=9, restored=None)
    assert not again and later["firstStepTime"] == body["firstStepTime"], "the same facts"
    reporter.close(timeout_s=10)
    fresh, _ = GenerationFacts(0).add({"step": 1}, reports=1, restored=None)
    assert (fresh["restoredFrom"], fresh["restoredStep"]) == ("start", 0)


class Flaky(Recorder):
    """An API server that fails the first ``failures`` writes, in the ways a busy or
    restarting one does (some of them are not OSErrors)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.tried = 0

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import http.client
        import urllib.error

        self.tried += 1
        if self.tried <= self.failures:
            raise (
                http.client.IncompleteRead(b"")
                if self.tried % 2
                else urllib.error.URLError("connection refused")
            )
        return super().call(method, body)


def test_a_failed_write_is_tried_again_and_never_ends_the_reporter() -> None:
    from tests.kube import wait_for

    sink = Flaky(failures=3)
    reporter = JobStatusReporter(sink, min_interval_s=0.1)  # type: ignore[arg-type]
    reporter.report({"step": 1})
    wait_for(lambda: sink.bodies == [{"step": 1}], 30, "the report, after 3 failed writes")
    assert reporter.failures == 3 and reporter.sent == 1
    reporter.report({"step": 2})  # the thread is alive: a later report goes too
    reporter.close(timeout_s=10)
    assert sink.bodies == [{"step": 1}, {"step": 2}]


def test_close_keeps_trying_the_last_report_until_its_deadline() -> None:
    sink = Flaky(failures=4)
    reporter = JobStatusReporter(sink, min_interval_s=600.0)  # type: ignore[arg-type]
    reporter.report({"step": 9, "lastCheckpoint": "/r/checkpoint_000009"})
    reporter.close(timeout_s=30)
    assert [b["step"] for b in sink.bodies] == [9], "the last report landed after the failures"
    assert sink.tried == 5


class Revoked(Recorder):
    """The API server once the TorchJob is deleted: its ServiceAccount went with it, so the
    pod's token no longer authenticates (401), or the job is gone (404)."""

    def __init__(self, code: int, after: int = 0) -> None:
        super().__init__()
        self.code, self.after, self.tried = code, after, 0

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import email.message
        import urllib.error

        self.tried += 1
        if self.tried > self.after:
            raise urllib.error.HTTPError(self.url, self.code, "gone", email.message.Message(), None)
        return super().call(method, body)


@pytest.mark.parametrize("code", [401, 403, 404])
def test_an_answer_no_retry_changes_ends_the_reports_and_close_does_not_wait(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.kube import wait_for

    sink = Revoked(code, after=1)
    reporter = JobStatusReporter(sink, min_interval_s=0.1)  # type: ignore[arg-type]
    reporter.report({"step": 1})
    wait_for(lambda: sink.bodies == [{"step": 1}], 30, "the first report")
    reporter.report({"step": 2})
    wait_for(lambda: reporter.gone == code, 30, f"HTTP {code} read as gone")
    reporter.report({"step": 3, "lastCheckpoint": "/r/checkpoint_000003"})
    reporter.close(timeout_s=30)
    # Before: the last report was tried again every 0.5-1 s until close()'s deadline, and a
    # deleted job's rank-0 pod was SIGKILLed at the end of its grace period.
    assert sink.tried == 2 and reporter.failures == 0, "tried once, never again"
    assert f"answered HTTP {code}" in caplog.text and "progress reports stop" in caplog.text


def test_a_server_error_is_still_retried() -> None:
    sink = Revoked(500)
    reporter = JobStatusReporter(sink, min_interval_s=600.0)  # type: ignore[arg-type]
    reporter.report({"step": 1})
    reporter.close(timeout_s=2)
    assert reporter.gone is None and sink.tried >= 2, "a 500 may pass: retried to the deadline"
