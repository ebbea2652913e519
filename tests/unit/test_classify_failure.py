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
