"""What a KeepSurvivors pod's runtime tells the operator in the job's status
(``status.silentWorkers``): the members it found silent (a vanished node, a partition:
nothing in Kubernetes says so while the node has not noticed), and that its own group broke
with its workers alive. Each pod applies its own entries (:class:`SilentReports`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from torchjob import contract
from torchjob.api.models import API_VERSION, KIND, SilentWorker
from torchjob.launch.store_probe import SWEEP_TIMEOUT_S, Connect, sweep
from torchjob.train.job_status import now_ms
from torchjob.train.recovery.formation import HOST, peer_address

HEARTBEAT = "heartbeat"
"""``SilentWorker.how``: its beats stopped while the group trained (the watchdog)."""


def silent_manager(reporter: str) -> str:
    """The field manager that owns pod ``reporter``'s entries of ``status.silentWorkers``."""
    return f"torchjob-silent-{reporter}"


def silent_apply(job: str, reports: Sequence[SilentWorker]) -> dict[str, Any]:
    """The server-side apply of the status of TorchJob ``job`` that says ``reports``: all
    that their reporter says (an apply that leaves out an entry it applied before removes
    it)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job},
        "status": {"silentWorkers": [r.to_wire() for r in reports]},
    }


class SilentReports:
    """The pods this pod's runtime found silent in the current generation, written into the
    job's ``status.silentWorkers`` (KeepSurvivors).

    The list is a list map keyed by reporter and pod, and each survivor writes its own
    entries with a server-side apply under its own field manager (:func:`silent_manager`),
    so the API server merges the reports of survivors that write at once; a merge patch
    would replace the whole list, and the partition rule of the operator
    (``torchjob_operator.torchjob.silent``: a reported pod's report does not count) would
    rarely see both sides. An apply holds everything its manager says, so a generation's
    reports accumulate here and every write sends them all (a later generation's first
    report drops the earlier one's); writes run one at a time, each sending the reports as
    they are then, so the last write holds them all."""

    def __init__(self, endpoint: Any, pod: contract.PodEnv, connect: Connect | None = None) -> None:
        self.endpoint = endpoint
        self.pod = pod
        self.job = pod.job_name
        self.by = contract.worker_pod_name(pod.job_name, pod.pod_index)
        self.nproc = max(1, pod.nproc_per_node)
        self._connect = connect
        self.say: Callable[[str], None] | None = None
        """Where a written report is said, with how long it took (the run's console)."""
        self.seen_after: Callable[[int], float | None] | None = None
        """When this pod first saw a generation later than the one given (monotonic; None
        while none is published): ``MembershipWatch.seen_after`` (:meth:`moved_on`)."""
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._sweeping = threading.Lock()
        self._generation = -1
        self._swept = -1
        self._seconds: dict[str, tuple[float, str, str]] = {}
        """Each pod found silent: how long, how, and when first (RFC 3339, ms, UTC)."""
        self._ahead = -1
        self._unswept = 0
        """Reports on their thread whose sweep has not ended (:meth:`broken` leaves its write
        to them)."""
        self._early: tuple[int, float, dict[int, bool | None]] | None = None
        """The sweep run ahead: (generation, when it ended (monotonic), rank: answer)."""

    @classmethod
    def of(cls, pod: contract.PodEnv | None, endpoint: Any) -> SilentReports | None:
        """The reports of a pod that can reach its job's status; else None."""
        return None if pod is None or endpoint is None else cls(endpoint, pod)

    def record(
        self,
        ranked: Sequence[int],
        generation: int,
        rank: int,
        silent_s: float,
        how: str = HEARTBEAT,
    ) -> bool:
        """Note the pod of global ``rank`` silent in ``generation`` (``ranked``: that
        generation's pod indices in rank order), found by ``how`` (``HEARTBEAT``,
        ``STORE``); False when that names no pod, or an older generation than one already
        reported."""
        place = rank // self.nproc
        if place >= len(ranked):
            return False
        with self._lock:
            if generation < self._generation:
                return False
            if generation > self._generation:
                self._generation, self._seconds = generation, {}
            name = contract.worker_pod_name(self.job, ranked[place])
            if name not in self._seconds or self._seconds[name][1] == HOST:
                # A sweep that ran ahead of the watchdog's own report says less of how; the
                # first finding says when (the operator holds a report of rank 0 from then).
                first = self._seconds[name][2] if name in self._seconds else now_ms()
                self._seconds[name] = (round(silent_s, 1), how, first)
        return True

    def sweep(self, ranked: Sequence[int], generation: int) -> None:
        """Once a generation, after its first silent peer: probe every other member's host
        not reported yet (:data:`SWEEP_TIMEOUT_S` each, all at once) and note those that
        do not answer (``HOST``). A node that vanishes takes all of its pods, and the
        watchdog may see only one of them: the pod of rank 0 serves the store every beat
        goes through, so its silence hides its node-mates'. Found now, they leave with it in
        one generation; found later, each would cost a generation that waits for them.

        A caller that comes while the sweep runs waits for it (then returns): the report of a
        second silent peer must not be written before the sweep's, or the operator publishes
        the next generation without the node-mates, and their reports, of the generation
        before, count for nothing (seen on the fleet bench: two of a node's four pods left
        one generation later, found by the next formation)."""
        with self._sweeping:
            with self._lock:
                if self._swept >= generation or generation != self._generation:
                    return
                named = set(self._seconds)
            hosts = self._hosts(ranked, named)
            answers = self._answers_ahead(generation, hosts) or sweep(
                hosts, SWEEP_TIMEOUT_S, self._connect, moot=self._named(ranked)
            )
            for rank, answer in answers.items():
                if answer is False:
                    self.record(ranked, generation, rank, SWEEP_TIMEOUT_S, HOST)
            with self._lock:
                self._swept = max(self._swept, generation)

    def sweep_ahead(self, ranked: Sequence[int], generation: int) -> None:
        """Sweep every other member's host now, on a thread, and keep the answers for the
        :meth:`sweep` of ``generation`` (once a generation): the store of rank 0 has been
        quiet for ``heartbeat.quiet_after`` and, if it stays so, rank 0 is found silent
        :data:`SWEEP_TIMEOUT_S` later, when the answers are in. Kept apart until then: a
        store that answers again reports nothing."""
        with self._lock:
            if generation < max(self._generation, self._ahead + 1):
                return
            self._ahead = generation

        def run() -> None:
            with self._sweeping:
                answers = sweep(self._hosts(ranked, set()), SWEEP_TIMEOUT_S, self._connect)
                with self._lock:
                    self._early = (generation, time.monotonic(), answers)

        threading.Thread(target=run, name="torchjob-sweep-ahead", daemon=True).start()

    def _named(self, ranked: Sequence[int]) -> Callable[[frozenset[int]], bool]:
        """Whether every one of some first ranks of members (a sweep's hosts not answered yet)
        has been reported by now: the watchdog declares a vanished node's ranks one after
        another, and the sweep that the first one started need not wait for the others."""

        def named(ranks: frozenset[int]) -> bool:
            with self._lock:
                pods = set(self._seconds)
            return all(
                contract.worker_pod_name(self.job, ranked[r // self.nproc]) in pods for r in ranks
            )

        return named

    def _hosts(self, ranked: Sequence[int], named: set[str]) -> dict[int, tuple[str, int]]:
        """The host of every member but this pod and ``named``, by its first rank."""
        return {
            place * self.nproc: peer_address(self.pod, index)
            for place, index in enumerate(ranked)
            if index != self.pod.pod_index
            and contract.worker_pod_name(self.job, index) not in named
        }

    def _answers_ahead(self, generation: int, ranks: Collection[int]) -> dict[int, bool | None]:
        """The sweep run ahead for ``generation``, if it ended within :data:`SWEEP_TIMEOUT_S`
        and asked every one of ``ranks``; else nothing (sweep again)."""
        with self._lock:
            early = self._early
        if early is None or early[0] != generation:
            return {}
        if time.monotonic() - early[1] > SWEEP_TIMEOUT_S or not set(ranks) <= set(early[2]):
            return {}
        return {r: early[2][r] for r in ranks}

    def moved_on(self, generation: int, rank: int, silent_s: float) -> bool:
        """Whether ``rank``'s beats in ``generation`` stopped after this pod saw a later
        generation published: it moved on (it left at its next report, as asked), and a
        watchdog still judging the old generation (its rank stuck in a step) reads that as
        silence. Such a report is not written; the operator's rule
        (``torchjob_operator.torchjob.silent.moved_on``) would count it for nothing, and the
        job's status would name a live pod. A silence that began before is reported."""
        later = self.seen_after(generation) if self.seen_after is not None else None
        if later is None or time.monotonic() - silent_s <= later:
            return False
        self._said(
            f"rank {rank}'s beats in generation {generation} stopped after a later generation "
            "was published: it moved on, not reported silent"
        )
        return True

    def _said(self, text: str) -> None:
        if self.say is not None:
            with contextlib.suppress(Exception):
                self.say(f"[torchjob] {text}")

    def reports(self) -> list[SilentWorker]:
        with self._lock:
            return [
                SilentWorker(
                    pod=p, generation=self._generation, by=self.by, seconds=s, how=how, at=at
                )
                for p, (s, how, at) in self._seconds.items()
            ]

    def write(self) -> None:
        """Apply every report of the generation; raises when the API server cannot be
        reached or refuses (the caller decides what that means)."""
        with self._writing:
            body = silent_apply(self.job, self.reports())
            self.endpoint.apply(body, field_manager=silent_manager(self.by))

    def broken(self, generation: int) -> None:
        """Say on a thread that this pod's group of ``generation`` broke with its own workers
        alive (``SilentWorker.BROKEN``, about itself), beside what it found silent. Nothing
        else tells the operator: a group that every member left for a peer's closed
        connection, with no pod lost, would otherwise wait for a next generation that no
        loss brings (bench/results/2026-12-03a: 231 s without a step). Best effort, as
        :meth:`report`.

        While a report's sweep runs, nothing is written here: that report's write, once its
        sweep has found the silent peer's node-mates, carries this entry too. Written at
        once, it told the operator of rank 0's silence without its node-mates (the report
        it holds was recorded before the sweep), and the operator published a generation
        that kept them, then another 0.5 s later (bench/results/2026-12-06e, loss 1)."""
        with self._lock:
            if generation < self._generation:
                return
            if generation > self._generation:
                self._generation, self._seconds = generation, {}
            if self.by in self._seconds:
                return
            self._seconds[self.by] = (0.0, SilentWorker.BROKEN, now_ms())
            if self._unswept:
                return

        def send() -> None:
            t0 = time.monotonic()
            try:
                self.write()
            except Exception as e:  # the operator learns of a loss from the other members
                self._said(f"could not report the broken group of generation {generation}: {e}")
                return
            self._said(
                f"reported the group of generation {generation} broken, this pod's workers "
                f"alive, to the job's status in {time.monotonic() - t0:.1f}s"
            )

        threading.Thread(target=send, name="torchjob-broken-report", daemon=True).start()

    def report(
        self, ranked: Sequence[int], generation: int, rank: int, silent_s: float, how: str
    ) -> None:
        """:meth:`record` and :meth:`write` on a thread: never blocks the driver; best
        effort (a survivor that cannot reach the API server leaves it to the others)."""
        if how == HEARTBEAT and self.moved_on(generation, rank, silent_s):
            return
        if not self.record(ranked, generation, rank, silent_s, how):
            return
        with self._lock:
            self._unswept += 1

        def send() -> None:
            t0 = time.monotonic()
            try:
                try:
                    self.sweep(ranked, generation)
                finally:
                    with self._lock:
                        self._unswept -= 1
                swept = time.monotonic() - t0
                self.write()
            except Exception as e:  # the other survivors report too
                self._said(f"could not write the silent report of generation {generation}: {e}")
                return
            names = ", ".join(r.pod for r in self.reports() if r.generation == generation)
            self._said(
                f"reported {names} silent (generation {generation}) to the job's status in "
                f"{time.monotonic() - t0:.1f}s (the members' hosts swept in {swept:.1f}s)"
            )

        threading.Thread(target=send, name="torchjob-silent-report", daemon=True).start()


def early_sweep(m: Any, reports: SilentReports | None) -> Callable[[], None] | None:
    """KeepSurvivors (a published membership ``m``): start the sweep of the members' hosts
    ahead (:meth:`SilentReports.sweep_ahead`); elsewhere None."""
    if m is None or reports is None:
        return None
    return lambda: reports.sweep_ahead(m.ranked, m.generation)


def silent_reporter(
    m: Any, reports: SilentReports | None
) -> Callable[[int, float, str], None] | None:
    """KeepSurvivors (a published membership ``m``): report a silent rank of another pod to
    the job's status (:meth:`SilentReports.report`); elsewhere None."""
    if m is None or reports is None:
        return None
    return lambda rank, s, how: reports.report(m.ranked, m.generation, rank, s, how)
