"""A real MLflow tracking server for the tests: ``mlflow server`` as a subprocess on a free port,
its runs in a sqlite file and its artifacts in a temporary directory, waited on by polling its
``/health`` endpoint. Start-up imports MLflow's server in two processes (about 15 s of CPU, more
wall time on a loaded machine), so the fixture is session-scoped: one server per pytest session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube import wait_for
from torchjob.contract import free_port

START_TIMEOUT_S = 600.0
"""Generous: the server's imports take minutes of wall time on a 2-core machine under load."""


def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(
            f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        )
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_server(root: Path) -> tuple[str, subprocess.Popen[bytes], Path]:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = root / "server.log"
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no third process (its job runner)
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True
        )
    return f"http://127.0.0.1:{port}", proc, log


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a running MLflow tracking server (``http://127.0.0.1:<port>``)."""
    url, proc, log = start_server(tmp_path_factory.mktemp("mlflow"))
    try:
        wait_for(
            lambda: _healthy(url, proc, log),
            START_TIMEOUT_S,
            lambda: f"mlflow server at {url} to answer /health\n{log.read_text()[-3000:]}",
            interval=0.5,
        )
        yield url
    finally:
        # The server runs uvicorn as a child: end the process group this fixture started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def closed_port_uri() -> str:
    """An HTTP URI nothing listens on (the port was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}"
