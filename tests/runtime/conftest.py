"""Shared fixtures of the runtime suite: real worker processes, gloo on CPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.tracking import mlflow_server  # noqa: F401 - a real MLflow server, session-wide

from torchjob.launch import WorkerGroup


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/runtime" in str(item.fspath):
            item.add_marker(pytest.mark.runtime)


@pytest.fixture(scope="session")
def _group3_holder() -> Iterator[list[WorkerGroup]]:
    holder: list[WorkerGroup] = []
    yield holder
    for group in holder:
        group.shutdown()


@pytest.fixture
def group3(_group3_holder: list[WorkerGroup]) -> WorkerGroup:
    """One 3-rank group shared by the session's tests (start-up costs a torch import per rank,
    about 3 s of CPU each). A test that left it broken gets it replaced, so one failure does
    not fail the tests after it for the wrong reason."""
    if _group3_holder and _group3_holder[0].is_broken:
        _group3_holder.pop().shutdown(timeout_s=0)
    if not _group3_holder:
        group = WorkerGroup(3, timeout_s=60)
        group.start()
        _group3_holder.append(group)
    return _group3_holder[0]
