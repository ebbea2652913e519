"""The in-pod agent's last word: why this pod's training stopped, in its termination message.

The kubelet copies the file at the container's ``terminationMessagePath`` into
``status.containerStatuses[].state.terminated.message``. The operator reads it back
(``torchjob.contract.parse_termination_message``) to put the root cause, with its rank,
into ``status.lastFailure``, the ``WorkerFailed`` Event and ``kubectl describe``, and to
blame the pod whose rank raised rather than the peers whose connections broke because of
it. Writing is best effort: outside a pod, or with no writable path, nothing happens.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from torchjob import contract
from torchjob.launch.errors import LaunchError, WorkerDiedError, WorkerGroupError

log = logging.getLogger(__name__)

_TRACEBACK_LINES = 20


def failure_message(err: BaseException) -> str:
    """The termination message for ``err``: the root cause first, then a traceback tail."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, LaunchError):
        err = cause
    if isinstance(err, WorkerGroupError):
        tail = "\n".join(err.traceback_text.strip().splitlines()[-_TRACEBACK_LINES:])
        return contract.termination_message(str(err), tail, peer_failure=err.peer_failure)
    if isinstance(err, WorkerDiedError):
        # SIGKILLed: with the OOM killer's evidence a charged failure, else a kill from outside
        # (a disruption) for the operator and ``torchjob run`` (``torchjob.rules.loss``).
        return contract.termination_message(
            str(err), killed=err.signal == signal.SIGKILL, oom=err.oom
        )
    if isinstance(err, LaunchError):
        return contract.termination_message(str(err))
    return contract.termination_message(f"{type(err).__name__}: {err}")


def with_oom_evidence(err: LaunchError, oom_before: int | None) -> LaunchError:
    """``err`` marked as the OOM killer's when it is a worker SIGKILLed while the cgroup's
    ``oom_kill`` counter moved past ``oom_before`` (``contract.oom_kills()`` read when the
    workers started)."""
    if (
        isinstance(err, WorkerDiedError)
        and err.signal == signal.SIGKILL
        and not err.oom
        and contract.oom_since(oom_before)
    ):
        return WorkerDiedError(err.rank, err.exitcode, oom=True)
    return err


def write_termination_message(text: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Write ``text`` where the kubelet looks for it; the path, or None when not in a pod."""
    env = os.environ if environ is None else environ
    if contract.JOB_NAME not in env:
        return None
    path = Path(env.get(contract.TERMINATION_LOG) or contract.DEFAULT_TERMINATION_LOG)
    try:
        path.write_text(text)
    except OSError as e:
        log.debug("cannot write the termination message to %s: %s", path, e)
        return None
    return path
