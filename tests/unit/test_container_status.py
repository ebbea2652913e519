"""What containers say about themselves: the runtime's termination message, read back by the
operator, and the kubelet's waiting reasons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from torchjob import contract
from torchjob.launch import CollectiveTimeoutError, WorkerGroupError
from torchjob.launch.termination import failure_message, write_termination_message
from torchjob.train.errors import TrainingFailedError


def test_root_cause_round_trips_with_its_rank_and_traceback_tail() -> None:
    tb = "\n".join(f"  frame {i}" for i in range(50)) + "\nValueError: bad batch"
    err = WorkerGroupError(3, "ValueError", "bad batch", tb, other_failures={2: "peer"})
    text = failure_message(TrainingFailedError(str(err), cause=err, result=None))
    first, *rest = text.splitlines()
    assert first == "torchjob: rank 3 raised ValueError: bad batch (rank(s) 2 also failed)"
    assert rest[-1] == "ValueError: bad batch" and "frame 0" not in text, "only the tail"
    parsed = contract.parse_termination_message(text)
    assert parsed == contract.TerminationSummary(
        "rank 3 raised ValueError: bad batch (rank(s) 2 also failed)", peer_failure=False
    )


def test_peer_failure_is_marked_so_the_operator_blames_another_pod() -> None:
    err = WorkerGroupError(0, "DistBackendError", "Connection closed by peer", peer_failure=True)
    parsed = contract.parse_termination_message(failure_message(err))
    assert parsed is not None and parsed.peer_failure
    assert parsed.line == "rank 0 raised DistBackendError: Connection closed by peer"


def test_other_errors_and_log_tails() -> None:
    hung = failure_message(CollectiveTimeoutError(1, hung_ranks=[1, 2]))
    assert contract.parse_termination_message(hung) == contract.TerminationSummary(
        "rank 1 hung: a collective timed out waiting for rank(s) 1, 2"
    )
    assert failure_message(KeyError("lr")).startswith("torchjob: KeyError: 'lr'")
    # FallbackToLogsOnError: the log's last line is the exception of a Python traceback.
    log_tail = "epoch 3\nTraceback (most recent call last):\n  ...\nRuntimeError: CUDA OOM\n\n"
    assert contract.parse_termination_message(log_tail) == contract.TerminationSummary(
        "RuntimeError: CUDA OOM"
    )
    assert contract.parse_termination_message(" \n") is None


@given(st.text(), st.text(), st.booleans())
def test_message_never_exceeds_what_the_kubelet_keeps(
    summary: str, detail: str, peer: bool
) -> None:
    text = contract.termination_message(summary * 50, detail * 200, peer_failure=peer)
    assert len(text.encode()) <= contract.TERMINATION_MESSAGE_LIMIT
    parsed = contract.parse_termination_message(text)
    assert parsed is not None and parsed.peer_failure == peer


def test_written_only_inside_a_pod(tmp_path: Path) -> None:
    target = tmp_path / "termination-log"
    assert write_termination_message("x", {contract.TERMINATION_LOG: str(target)}) is None
    assert not target.exists(), "outside a TorchJob pod nothing is written"
    inside = {contract.JOB_NAME: "j", contract.TERMINATION_LOG: str(target)}
    assert write_termination_message("why", inside) == target
    assert target.read_text() == "why"
    missing = {contract.JOB_NAME: "j", contract.TERMINATION_LOG: str(tmp_path / "no" / "f")}
    assert write_termination_message("why", missing) is None, "best effort, never raises"


def _failed_pod(message: str) -> dict:
    terminated = {"exitCode": 1, "reason": "Error", "message": message}
    return {
        "metadata": {"name": "j-worker-0", "labels": {contract.LABEL_POD_INDEX: "0"}},
        "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]},
    }


def test_the_operator_reads_the_summary_from_the_container_status() -> None:
    from torchjob_operator.torchjob.observed import pod_view

    err = WorkerGroupError(0, "DistBackendError", "Connection closed by peer", peer_failure=True)
    view = pod_view(_failed_pod(failure_message(err)))
    assert view is not None and view.peer_failure
    assert view.summary == "rank 0 raised DistBackendError: Connection closed by peer"
    logs = pod_view(_failed_pod("Traceback (most recent call last):\nKeyError: 'lr'\n"))
    assert logs is not None and (logs.summary, logs.peer_failure) == ("KeyError: 'lr'", False)


def test_the_operator_sees_containers_that_cannot_start() -> None:
    from torchjob_operator.torchjob.observed import pod_view

    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}
    pod = {
        "metadata": {"name": "j-worker-0", "labels": {contract.LABEL_POD_INDEX: "0"}},
        "status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": waiting}}]},
    }
    view = pod_view(pod)
    assert view is not None
    assert (view.waiting, view.waiting_message) == (
        "ImagePullBackOff",
        'Back-off pulling image "nope:1"',
    )
    pod["status"]["containerStatuses"][0]["state"]["waiting"] = {"reason": "ContainerCreating"}
    normal = pod_view(pod)
    assert normal is not None and normal.waiting == "", "a normal wait is not a problem"


def _owned(name: str, uid: str | None, *, controller: bool = True) -> dict[str, Any]:
    refs = [] if uid is None else [{"uid": uid, "controller": controller, "kind": "TorchJob"}]
    return {"metadata": {"name": name, "ownerReferences": refs}}


def test_only_pods_whose_controller_is_this_job_are_its_own() -> None:
    from torchjob_operator.common.owners import controller_uid
    from torchjob_operator.torchjob.observed import split_by_owner

    assert controller_uid(_owned("a", "u2")) == "u2"
    assert controller_uid(_owned("a", "u2", controller=False)) is None
    assert controller_uid({"metadata": {}}) is None
    pods = [
        _owned("tj-worker-1", "u1"),  # the earlier job's, still terminating
        _owned("tj-worker-0", "u2"),
        _owned("tj-worker-0x", None),  # no owner at all: not this job's either
    ]
    ours, others = split_by_owner(pods, "u2")
    assert [p["metadata"]["name"] for p in ours] == ["tj-worker-0"]
    assert others == ("tj-worker-0x", "tj-worker-1")


def test_a_never_pod_whose_containers_all_ended_has_ended_before_the_kubelet_says_so() -> None:
    """The kubelet reports a SIGKILLed container first and the pod's terminal phase about a
    second later; the operator judges the loss on the first report."""
    from torchjob_operator.engine.objects import trim_pod
    from torchjob_operator.torchjob.observed import PodPhase, pod_view

    def pod(policy: str, *codes: int | None) -> dict[str, Any]:
        states = [
            {"state": {"terminated": {"exitCode": c}} if c is not None else {"running": {}}}
            for c in codes
        ]
        return {
            "metadata": {"name": "j-worker-1", "labels": {contract.LABEL_POD_INDEX: "1"}},
            "spec": {"restartPolicy": policy, "nodeName": "n"},
            "status": {"phase": "Running", "containerStatuses": states},
        }

    killed = pod_view(trim_pod(pod("Never", 137)))
    assert killed is not None and killed.phase == PodPhase.FAILED and killed.exit_code == 137
    done = pod_view(pod("Never", 0))
    assert done is not None and done.phase == PodPhase.SUCCEEDED
    # A container still running (a sidecar), or a policy that restarts it: the pod goes on.
    assert (v := pod_view(pod("Never", 137, None))) is not None and v.phase == PodPhase.RUNNING
    assert (v := pod_view(pod("OnFailure", 137))) is not None and v.phase == PodPhase.RUNNING
