"""The termination message: the runtime's failure summary, read by the operator.

A worker container writes it to its termination log (``TORCHJOB_TERMINATION_LOG``, by default
``/dev/termination-log``): one tagged line saying why it stopped (a root cause, a peer's
failure, or a process killed from outside), then a traceback tail. The operator reads it back
from the pod's container status (``parse_termination_message``), also when the kubelet fell
back to the log's tail. Part of the env contract (``torchjob.contract`` re-exports it);
standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

TERMINATION_MESSAGE_LIMIT: Final = 4096
"""The kubelet keeps at most 4096 bytes of a container's termination message."""
_TERMINATION_TAG: Final = "torchjob: "
_PEER_TAG: Final = "peer failure: "
_KILLED_TAG: Final = "killed: "


@dataclass(frozen=True)
class TerminationSummary:
    """What a worker container's termination message says about why it stopped."""

    line: str
    """One line for a person: the root-cause exception with its rank, or the log's last line."""
    peer_failure: bool = False
    """The container failed only because a peer did (a broken connection): not a root cause."""
    killed: bool = False
    """A worker process of the container was killed from outside (SIGKILL: ``kill -9``, the
    OOM killer): a hard loss, as if the container had exited 137."""


def termination_message(
    summary: str, detail: str = "", *, peer_failure: bool = False, killed: bool = False
) -> str:
    """The text the runtime writes to the termination log: one tagged summary line, then
    ``detail`` (a traceback tail), cut to what the kubelet keeps."""
    line = next((ln.strip() for ln in summary.splitlines() if ln.strip()), "failed")
    tag = _PEER_TAG if peer_failure else _KILLED_TAG if killed else ""
    head = _TERMINATION_TAG + tag + line
    text = f"{head}\n{detail.strip()}" if detail.strip() else head
    data = text.encode()
    if len(data) <= TERMINATION_MESSAGE_LIMIT:
        return text
    return data[: TERMINATION_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def parse_termination_message(text: str) -> TerminationSummary | None:
    """Read back a termination message: ours (tagged) or a log tail (``FallbackToLogsOnError``).

    For a log tail the last non-empty line is the summary: a Python traceback ends with the
    exception. ``None`` when there is no message at all.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    first = lines[0]
    if first.startswith(_TERMINATION_TAG):
        line = first[len(_TERMINATION_TAG) :]
        if line.startswith(_PEER_TAG):
            return TerminationSummary(line[len(_PEER_TAG) :].strip(), peer_failure=True)
        if line.startswith(_KILLED_TAG):
            return TerminationSummary(line[len(_KILLED_TAG) :].strip(), killed=True)
        return TerminationSummary(line.strip())
    return TerminationSummary(lines[-1].strip())
