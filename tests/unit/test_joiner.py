"""A pod created ahead of its generation (an elastic job's joiner) waits for the operator to
publish that generation before it forms a group (docs/api.md, semantics 13)."""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from tests.unit.test_membership import OpenWatch, ScriptedEndpoint, event

from torchjob.train.modes import KeepSurvivorsMode
from torchjob.train.progress import ProgressView
from torchjob.train.ready import JoinerReady
from torchjob.train.recovery.membership import GenerationTimeout, Membership, MembershipWatch


def joiner(ready: Path, *events: dict) -> tuple[KeepSurvivorsMode, SimpleNamespace, io.StringIO]:
    watch = MembershipWatch(ScriptedEndpoint(OpenWatch(list(events))))
    out = io.StringIO()
    # Port 0: a free port, where a pod listens on contract.JOINER_READY_PORT.
    said = JoinerReady(ready, port=0)
    mode = KeepSurvivorsMode(watch, Membership(generation=2, replicas=2), ready=said)
    return mode, SimpleNamespace(stop_requested=threading.Event()), out


def view(out: io.StringIO) -> ProgressView:
    return ProgressView(enabled=False, total_epochs=None, console=Console(file=out))


def test_a_joiner_forms_its_group_only_once_its_generation_is_published(tmp_path: Path) -> None:
    mode, c, out = joiner(
        tmp_path / "ready",
        event("ADDED", 1, currentGeneration=1, replicas=1, phase="Running"),
        event("MODIFIED", 2, currentGeneration=2, replicas=2, phase="Restarting"),
    )
    try:
        mode.await_own_generation(c, view(out))  # type: ignore[arg-type]
        assert (mode.membership.generation, mode.membership.replicas) == (2, 2)
    finally:
        mode.watch.close()


def test_a_pod_of_the_published_generation_does_not_wait(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    mode, c, out = joiner(
        ready, event("ADDED", 1, currentGeneration=2, replicas=2, phase="Running")
    )
    try:
        mode.await_own_generation(c, view(out))  # type: ignore[arg-type]
        assert mode.membership.generation == 2 and out.getvalue() == ""
        # It reads Ready all the same: a joiner whose generation was published before it got
        # here trains, and must not read unready (0/1) to the kubelet all its life.
        assert ready.exists() and mode.ready.bound is not None
    finally:
        mode.ready.close()
        mode.watch.close()


def test_a_joiner_of_a_job_that_ended_gives_up(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    mode, c, out = joiner(
        ready, event("ADDED", 1, currentGeneration=1, replicas=1, phase="Succeeded")
    )
    try:
        with pytest.raises(GenerationTimeout, match="Succeeded"):
            mode.await_own_generation(c, view(out))  # type: ignore[arg-type]
        assert (
            "this pod waits to join (created for generation 2); the job runs generation 1"
            in out.getvalue()
        )
        assert ready.exists(), "it said it was ready to join (its readiness probe) before waiting"
        # The operator's probe (tcpSocket) connects, again and again, as the kubelet's does.
        port = mode.ready.bound
        assert port is not None
        for _ in range(3):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        mode.ready.close()
        mode.watch.close()
