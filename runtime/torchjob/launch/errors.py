"""Typed errors raised by the worker group.

They cross the process boundary as plain data (rank, type name, message,
traceback text) rather than as pickled exception objects, because a user's
exception class may not be importable in the driver. ``str(err)`` always leads
with the root cause and its rank, so the first line a user sees is the one that
matters (Ray issue #23405 is the counter-example).
"""

from __future__ import annotations

import signal


class LaunchError(RuntimeError):
    """Base class of every error the launcher raises."""


class WorkerGroupStartError(LaunchError):
    """The group could not be formed (a worker failed to start or to join the process group).

    ``waiting_for_peers`` is True when this host's workers were fine but the rendezvous
    did not complete: a rank elsewhere never came (or went away) in time.
    """

    def __init__(self, message: str, *, waiting_for_peers: bool = False) -> None:
        super().__init__(message)
        self.waiting_for_peers = waiting_for_peers

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_start_error, (str(self), self.waiting_for_peers))


def _rebuild_start_error(message: str, waiting: bool) -> WorkerGroupStartError:
    return WorkerGroupStartError(message, waiting_for_peers=waiting)


class RemoteTraceback(Exception):
    """A worker's traceback, as its process formatted it. It is the ``__cause__`` of the
    :class:`WorkerGroupError` that names the worker's rank, so the driver's traceback shows
    the line of the training function that raised, above its own frames (as
    ``concurrent.futures`` does for a process pool's errors)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class WorkerGroupError(LaunchError):
    """A function run by :meth:`WorkerGroup.execute` raised on some rank.

    ``rank`` is the root-cause rank: the first rank whose failure was not a
    consequence of another rank's failure (a peer's broken connection).
    ``peer_failure`` is True when every failure seen here was such a consequence:
    the root cause is on a rank this group does not hold (another pod's).
    """

    def __init__(
        self,
        rank: int,
        exc_type: str,
        message: str,
        traceback_text: str = "",
        *,
        other_failures: dict[int, str] | None = None,
        peer_failure: bool = False,
    ) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.traceback_text = traceback_text
        self.other_failures = dict(other_failures or {})
        self.peer_failure = peer_failure
        super().__init__(self._summary())
        if traceback_text:
            self.__cause__ = RemoteTraceback(traceback_text)

    def _summary(self) -> str:
        text = f"rank {self.rank} raised {self.exc_type}: {self.message}"
        if self.other_failures:
            others = ", ".join(str(r) for r in sorted(self.other_failures))
            text += f" (rank(s) {others} also failed)"
        return text

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (
            _rebuild_group_error,
            (
                self.rank,
                self.exc_type,
                self.message,
                self.traceback_text,
                self.other_failures,
                self.peer_failure,
            ),
        )


def _rebuild_group_error(
    rank: int, exc_type: str, message: str, tb: str, others: dict[int, str], peer: bool = False
) -> WorkerGroupError:
    return WorkerGroupError(rank, exc_type, message, tb, other_failures=others, peer_failure=peer)


EXIT_UNKNOWN = 256
"""The exit status of a worker whose zygote is gone (``torchjob.launch.zygote``): it exited,
but nobody could tell us how (exit codes are 0-255)."""


def describe_exit(exitcode: int | None) -> str:
    """``-9`` -> ``"killed by SIGKILL"``; ``3`` -> ``"exit code 3"``."""
    if exitcode is None:
        return "unknown exit status"
    if exitcode == EXIT_UNKNOWN:
        return "exited, status unknown (the zygote that started it is gone)"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class WorkerDiedError(LaunchError):
    """A worker process exited while it had work to do. ``oom``: the OOM killer killed it
    (its cgroup's ``oom_kill`` counter moved: ``torchjob.termination.oom_kills``)."""

    def __init__(self, rank: int, exitcode: int | None, *, oom: bool = False) -> None:
        self.rank = rank
        self.exitcode = exitcode
        self.oom = oom
        why = describe_exit(exitcode) + (" (the OOM killer)" if oom else "")
        super().__init__(f"rank {rank} worker process died: {why}")

    @property
    def signal(self) -> int | None:
        """Number of the signal that killed the worker, if one did."""
        if self.exitcode is not None and self.exitcode < 0:
            return -self.exitcode
        return None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_died, (self.rank, self.exitcode, self.oom))


def _rebuild_died(rank: int, exitcode: int | None, oom: bool = False) -> WorkerDiedError:
    return WorkerDiedError(rank, exitcode, oom=oom)


class CollectiveTimeoutError(LaunchError):
    """A collective timed out; ``rank`` is the (first) rank that never joined it."""

    def __init__(self, rank: int, *, hung_ranks: list[int] | None = None, detail: str = "") -> None:
        self.rank = rank
        self.hung_ranks = list(hung_ranks or [rank])
        self.detail = detail
        ranks = ", ".join(str(r) for r in self.hung_ranks)
        text = f"rank {rank} hung: a collective timed out waiting for rank(s) {ranks}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_timeout, (self.rank, self.hung_ranks, self.detail))


def _rebuild_timeout(rank: int, hung: list[int], detail: str) -> CollectiveTimeoutError:
    return CollectiveTimeoutError(rank, hung_ranks=hung, detail=detail)


_PEER_MARKERS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "socket closed",
    "communicator was aborted",
    "connection refused",
    "end of file",
    # gloo's full mesh could not connect while the group formed: a peer killed meanwhile
    # (bench/results/2026-12-04g hard-1: a newcomer's pod failed on it, a restart charged)
    "connectfullmesh failed",
)
_TIMEOUT_MARKERS = ("timed out", "timeout", "watchdog caught collective operation")


def classify_failure(exc: BaseException) -> str:
    """What a worker's exception means (pure): ``"timeout"`` (a collective timed out),
    ``"peer"`` (a consequence of another rank's failure: its socket closed, its store gone)
    or ``"user"`` (the training function's own error)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    dist_error = type(exc).__name__ in {"DistBackendError", "DistNetworkError", "DistStoreError"}
    if any(m in text for m in _TIMEOUT_MARKERS) and (
        dist_error or "gloo" in text or "nccl" in text
    ):
        return "timeout"
    if any(m in text for m in _PEER_MARKERS) and (
        dist_error or "gloo" in text or "nccl" in text or "store" in text
    ):
        return "peer"
    if dist_error:
        return "peer"
    return "user"
