"""The operator's log at INFO: what it decides, not a line per routine request."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from torchjob_operator.__main__ import quiet_routine_lines


@pytest.fixture
def quiet() -> Iterator[None]:
    kopf_objects, access = logging.getLogger("kopf.objects"), logging.getLogger("aiohttp.access")
    filters, level = list(kopf_objects.filters), access.level
    quiet_routine_lines()
    yield None
    kopf_objects.filters[:] = filters
    access.setLevel(level)


def test_routine_lines_are_left_out_and_everything_else_is_kept(
    quiet: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    objects = logging.getLogger("kopf.objects")
    objects.info("Handler 'torchjob_event' succeeded.")
    objects.info("Handler 'torchtune_event' succeeded.")
    logging.getLogger("aiohttp.access").info('10.0.0.1 "GET /healthz HTTP/1.1" 200')
    objects.info("Handler 'configure' succeeded.")
    objects.error("Handler 'torchjob_event' failed with an exception. Will retry.")
    logging.getLogger("torchjob_operator").info("[ns/tj] phase Pending -> Running")
    assert [r.getMessage() for r in caplog.records] == [
        "Handler 'configure' succeeded.",
        "Handler 'torchjob_event' failed with an exception. Will retry.",
        "[ns/tj] phase Pending -> Running",
    ]
