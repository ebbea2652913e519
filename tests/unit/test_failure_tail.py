"""tests/failure_tail.py: a wait's timeout, shortened for the end of a session's output."""

from __future__ import annotations

import json

import pytest
from tests import kube as k
from tests.failure_tail import MAX_LINES, TAIL, WIDTH, _wait_timeout, digest

NS = "t-test-node-lost-is-a-disruption-33a090"


def _message() -> str:
    """As ``Jobs.wait_running_pods`` composes it (operator_harness.Jobs.describe)."""
    status = {
        "phase": "Running",
        "currentGeneration": 1,
        "conditions": [{"type": "Ready", "status": "False", "reason": "Unschedulable"}],
        "restarts": 0,
        "disruptions": 1,
        "history": [
            {"generation": 0, "cause": "Start", "detail": "the job's first generation"},
            {"generation": 1, "cause": "NodeLost", "detail": "on-bad-node-worker-0: NodeLost"},
        ],
    }
    events = "; ".join(
        f"Normal/PodsCreated: created 2 worker pods for generation {g}" for g in (0, 1)
    )
    ns_events = [f"  Normal Scheduled Pod/on-bad-node-worker-{i % 2}: event {i}" for i in range(30)]
    log = [
        f"2026-12-06 10:00:{i:02d},000 INFO torchjob_operator [other/drain] line {i}"
        for i in range(30)
    ]
    log[5] = f"2026-12-06 10:00:05,000 INFO torchjob_operator [{NS}/on-bad-node] created pods"
    return "\n".join(
        [
            "timed out after 270s waiting for: 2 Running pods of generation 1",
            f"TorchJob {NS}/on-bad-node status:",
            *json.dumps(status, indent=1).splitlines(),
            f"events: {events}",
            f"--- namespace {NS}: pods",
            "  on-bad-node-worker-0: phase=Pending node=None priority=0 nominated=None",
            "    condition PodScheduled=False Unschedulable " + "0/6 nodes are available. " * 20,
            "  on-bad-node-worker-1: phase=Running node=gpu-node-1 priority=0 nominated=None",
            "    container trainer: running ready=True",
            f"--- namespace {NS}: events (latest 40)",
            *ns_events,
            "operator log (tail):",
            *log,
            "last value: None",
        ]
    )


def test_the_pods_stay_whole_and_the_rest_is_cut_to_its_latest() -> None:
    out = digest(_message())
    assert len(out) <= MAX_LINES
    assert all(len(line) <= 2 * WIDTH for line in out)
    assert out[0] == "timed out after 270s waiting for: 2 Running pods of generation 1"
    # The status on one line, its plain fields first.
    assert out[1].startswith(f'TorchJob {NS}/on-bad-node status: {{"phase":"Running",')
    assert '"disruptions":1,"conditions":[' in out[1] and "history" not in out[1]
    assert out[2] == (
        "history: 0 Start: the job's first generation; 1 NodeLost: on-bad-node-worker-0: NodeLost"
    )
    # Every pod line is there, a long condition cut to the width.
    pods = out.index(f"--- namespace {NS}: pods")
    assert out[pods + 1].startswith("  on-bad-node-worker-0: phase=Pending")
    assert len(out[pods + 2]) == WIDTH and out[pods + 2].endswith("...")
    assert out[pods + 4] == "    container trainer: running ready=True"
    # The namespace's latest Events.
    events = out.index(f"--- namespace {NS}: events (the last {TAIL} of 30)")
    assert out[events + TAIL] == "  Normal Scheduled Pod/on-bad-node-worker-1: event 29"
    # The operator log: its lines about the test's namespace, then its very last line.
    log = next(i for i, line in enumerate(out) if line.startswith("operator log"))
    assert out[log] == f"operator log: 1 of its 1 lines about {NS} (in its last 30)"
    assert out[log + 1].endswith(f"[{NS}/on-bad-node] created pods")
    assert out[log + 2].startswith("... its last line: ") and out[log + 2].endswith("line 29")
    assert out[-1] == "last value: None"


def test_a_message_of_another_shape_keeps_its_first_and_last_lines() -> None:
    message = "\n".join(f"line {i}" for i in range(100))
    out = digest(message, max_lines=12)
    assert len(out) == 12
    assert out[:4] == ["line 0", "line 1", "line 2", "line 3"]
    assert out[4] == "... (89 lines left out)"
    assert out[-1] == "line 99"


def test_a_wait_timeout_is_found_behind_the_error_raised_from_it() -> None:
    with pytest.raises(AssertionError) as caught:
        try:
            k.wait_for(lambda: False, 0.01, "never")
        except k.WaitTimeout as exc:
            raise AssertionError("the test's own words") from exc
    found = _wait_timeout(caught.value)
    assert isinstance(found, k.WaitTimeout)
    assert str(found).startswith("timed out after ")
    assert _wait_timeout(ValueError("no wait")) is None
