"""torchjob.train.ready: a joiner reads Ready to the kubelet's tcpSocket probe."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from torchjob import contract
from torchjob.train.ready import JoinerReady


def test_ready_writes_the_file_and_accepts_every_probe_until_closed(tmp_path: Path) -> None:
    ready = JoinerReady(tmp_path / "ready", port=0)
    assert ready.bound is None and not (tmp_path / "ready").exists()
    ready.set()
    ready.set()  # idempotent: one listener
    port = ready.bound
    assert port is not None and (tmp_path / "ready").exists()
    try:
        # More connections than a listen backlog holds: each one is accepted and closed.
        for _ in range(300):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        ready.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_taken_port_is_said_and_the_file_is_still_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        ready = JoinerReady(tmp_path / "ready", port=port)
        with caplog.at_level(logging.WARNING, logger="torchjob.train.ready"):
            ready.set()
    assert ready.bound is None and (tmp_path / "ready").exists()
    assert f"readiness port {port} cannot be bound" in caplog.text


def test_a_pods_joiner_listens_where_the_operators_probe_connects() -> None:
    ready = JoinerReady.probed()
    assert (ready.file, ready.port) == (
        Path(contract.JOINER_READY_FILE),
        contract.JOINER_READY_PORT,
    )
