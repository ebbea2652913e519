"""The Kueue test harness itself (tests/cluster/kueue_harness.py) against the real Kueue
binary: a port that ``free_port`` found free and another process took before Kueue bound
it must not fail the tests that need Kueue (CI, 2026-12-06: three Kueue tests errored at
setup on "bind: address already in use")."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from tests import kube as k
from tests.cluster.kueue_harness import KueueProcess

pytestmark = pytest.mark.cluster


def test_kueue_starts_again_on_new_ports_when_its_port_was_taken(
    cluster: k.Cluster, tmp_path: Path
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = int(held.getsockname()[1])
        proc = KueueProcess(cluster, tmp_path)
        proc.health_port = taken  # what another process grabbed after free_port() chose it
        try:
            proc.start()
            assert proc.health_port != taken, "started again on a new port"
            assert proc.proc is not None and proc.proc.poll() is None, proc.logs()
            url = f"http://127.0.0.1:{proc.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=5) as ready:
                assert ready.status == 200
        finally:
            proc.stop()
