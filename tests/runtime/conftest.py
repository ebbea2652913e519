"""Shared fixtures of the runtime suite: real worker processes, gloo on CPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchjob.launch import WorkerGroup


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/runtime" in str(item.fspath):
            item.add_marker(pytest.mark.runtime)


@pytest.fixture(scope="module")
def group3() -> Iterator[WorkerGroup]:
    """One 3-rank group shared by a module's tests (start-up costs a torch import per rank)."""
    with WorkerGroup(3, timeout_s=60) as group:
        yield group
