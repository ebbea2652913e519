"""Fixtures shared by the unit tests: ``s3_server``/``s3``, a real S3-compatible object store
(tests/s3.py), started once per session and only by the tests that ask for it; and
``copy_gate``, which holds the restore point's overlapped copies back."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tests.s3 import s3, s3_server  # noqa: F401


@pytest.fixture
def copy_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The restore point's overlapped copies (``recovery.host_copy``) wait until this gate
    opens (at most 10 s): the loop goes on while they are in flight. Opened at the end."""
    from torchjob.train.recovery import host_copy

    opened = threading.Event()
    copy_later = host_copy._copy_later

    def gated(dst: Any, src: Any) -> None:
        opened.wait(10)
        copy_later(dst, src)

    monkeypatch.setattr(host_copy, "_copy_later", gated)
    yield opened
    opened.set()
