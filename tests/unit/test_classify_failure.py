"""What a worker's exception means (torchjob.launch.errors.classify_failure): a collective
that timed out, a consequence of another rank's loss, or the training function's own error.
The messages are the ones gloo, NCCL and the store raise."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from torchjob.launch.errors import classify_failure


@pytest.mark.parametrize(
    ("exc", "meaning"),
    [
        (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), "peer"),
        (RuntimeError("[gloo/transport/tcp/pair.cc:598] Read error: Connection reset"), "peer"),
        (dist.DistNetworkError("failed to recv, got 0 bytes"), "peer"),
        (
            RuntimeError(
                "Gloo connectFullMesh failed with [./gloo/transport/tcp/pair.cc:144] no error"
            ),
            "peer",
        ),
        (dist.DistStoreError("the store at 10.0.0.3:29500 is gone"), "peer"),
        (dist.DistBackendError("NCCL communicator was aborted on rank 1"), "peer"),
        (
            RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms"),
            "timeout",
        ),
        (dist.DistBackendError("Watchdog caught collective operation timeout"), "timeout"),
        (ValueError("lr must be positive"), "user"),
        # A user's own network error is theirs, not a lost peer: no collective named.
        (ConnectionResetError("connection reset by the dataset server"), "user"),
        (TimeoutError("the HTTP download timed out"), "user"),
    ],
)
def test_a_workers_exception_is_classified(exc: BaseException, meaning: str) -> None:
    assert classify_failure(exc) == meaning


def test_a_timeout_waiting_for_a_rank_elsewhere_is_a_peer_failure() -> None:
    """A pod's rank whose collective timed out waiting for another pod's rank (lost or
    silent) blames that peer: its termination message says peer failure, so the operator
    never charges it (docs/architecture.md, "What each loss costs")."""
    from torchjob.launch.errors import WorkerGroupError
    from torchjob.launch.execution import _Failure, _root_cause

    timed_out = WorkerGroupError(
        0, "RuntimeError", "[gloo/transport/tcp/pair.cc:598] Timed out waiting 30000ms for recv"
    )
    root = _root_cause([_Failure(0, "timeout", 1.0, timed_out)], hung=[])
    assert isinstance(root, WorkerGroupError) and root.peer_failure
    own = WorkerGroupError(1, "ValueError", "lr must be positive")
    mixed = _root_cause(
        [_Failure(0, "timeout", 2.0, timed_out), _Failure(1, "user", 1.0, own)], hung=[]
    )
    assert isinstance(mixed, WorkerGroupError) and mixed.rank == 1 and not mixed.peer_failure
