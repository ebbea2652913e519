"""The termination message and the stop exit code: how a worker container tells the operator
(and ``torchjob run``) why it stopped.

A worker container writes it to its termination log (``TORCHJOB_TERMINATION_LOG``, by default
``/dev/termination-log``): one tagged line saying why it stopped (a root cause, a peer's
failure, or a process killed from outside, by the OOM killer or not), then a traceback tail.
The operator reads it back
from the pod's container status (``parse_termination_message``), also when the kubelet fell
back to the log's tail. Part of the env contract (``torchjob.contract`` re-exports it);
standard library only.

A worker that stopped as asked (a graceful stop, a drain, the job's deletion:
``torchjob.train.TrainingStoppedError`` left the user's script) exits with
:data:`STOPPED_EXIT_CODE` and no traceback; every launcher reads that code as "stopped as
asked" (``torchjob.rules.loss.Stopped``), never as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

TERMINATION_MESSAGE_LIMIT: Final = 4096
"""The kubelet keeps at most 4096 bytes of a container's termination message."""
_TERMINATION_TAG: Final = "torchjob: "
_PEER_TAG: Final = "peer failure: "
_KILLED_TAG: Final = "killed: "
_OOM_TAG: Final = "oom: "

STOPPED_EXIT_CODE: Final = 75
"""The exit code of a worker process that stopped as asked (sysexits' ``EX_TEMPFAIL``: the work
is not done and resumes later). Not a signal's code (those are 128 + n), not 1 (an
exception's), and outside the codes Python itself uses."""


@dataclass(frozen=True)
class TerminationSummary:
    """What a worker container's termination message says about why it stopped."""

    line: str
    """One line for a person: the root-cause exception with its rank, or the log's last line."""
    peer_failure: bool = False
    """The container failed only because a peer did (a broken connection): not a root cause."""
    killed: bool = False
    """A worker process of the container was SIGKILLed (``kill -9``, the OOM killer), as if the
    container had exited 137."""
    oom: bool = False
    """... by the OOM killer: the cgroup's ``oom_kill`` counter moved when it died."""


def termination_message(
    summary: str,
    detail: str = "",
    *,
    peer_failure: bool = False,
    killed: bool = False,
    oom: bool = False,
) -> str:
    """The text the runtime writes to the termination log: one tagged summary line, then
    ``detail`` (a traceback tail), cut to what the kubelet keeps."""
    line = next((ln.strip() for ln in summary.splitlines() if ln.strip()), "failed")
    tag = _PEER_TAG if peer_failure else _KILLED_TAG if killed or oom else ""
    if oom:
        tag += _OOM_TAG
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
            line = line[len(_KILLED_TAG) :]
            oom = line.startswith(_OOM_TAG)
            line = line[len(_OOM_TAG) :] if oom else line
            return TerminationSummary(line.strip(), killed=True, oom=oom)
        return TerminationSummary(line.strip())
    return TerminationSummary(lines[-1].strip())


def oom_kills(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """How many processes the OOM killer has killed in this process's cgroup (and below it):
    ``oom_kill`` of cgroup v2's ``memory.events``, or of v1's ``memory.oom_control``; None
    where neither can be read (no cgroup, another OS). A launcher reads it before a worker
    starts and after it died of SIGKILL: a larger count is the OOM killer's evidence."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2: "0::/path"
            found = _counter(cgroup_root / rel / "memory.events", "oom_kill")
        elif "memory" in controllers.split(","):  # v1: "N:memory:/path"
            found = _counter(cgroup_root / "memory" / rel / "memory.oom_control", "oom_kill")
        else:
            continue
        if found is not None:
            return found
    return None


def _counter(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def oom_since(before: int | None) -> bool:
    """The OOM killer killed a process of this cgroup since ``oom_kills()`` said ``before``."""
    after = oom_kills()
    return before is not None and after is not None and after > before
