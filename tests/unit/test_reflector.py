"""The reflector's loop (``engine.reflector``) when a resource cannot be listed: it waits and
looks again, saying so once, and never ends the thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from torchjob_operator.engine import reflector
from torchjob_operator.engine.reflector import Reflector


class Refused(Reflector):
    what = "nodes"

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status
        self.calls = 0
        self.tried_twice = threading.Event()

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls >= 3:
            self.tried_twice.set()
        raise ApiException(status=self.status, reason="Forbidden" if self.status == 403 else "")


@pytest.mark.parametrize(
    ("status", "said"),
    [(403, "not readable by the operator's account"), (404, "not served by the API server")],
)
def test_a_resource_it_may_not_or_cannot_list_is_looked_for_again_said_once(
    status: int, said: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(reflector, "ABSENT_WAIT_S", 0.01)
    caplog.set_level(logging.INFO, logger="torchjob_operator.engine.reflector")
    r = Refused(status)
    r.start()
    try:
        assert r.tried_twice.wait(10), "it looks again"
    finally:
        r.stop()
    lines = [rec.getMessage() for rec in caplog.records]
    assert sum(said in line for line in lines) == 1, lines
    assert not [line for line in lines if "failed" in line], "no warning per attempt"
