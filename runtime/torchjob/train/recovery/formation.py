"""While a KeepSurvivors generation forms: which of its members' hosts answer, and which
members never arrive.

The heartbeat watchdog (``torchjob.launch.heartbeat``) runs only once a group has formed;
until then, every worker waits for rank 0's store up to the collective timeout, and a member
whose node vanished in that window is found only by the node controller, ~40 s later.
:class:`FormationWatch` probes from the driver instead (``torchjob.launch.store_probe``): a
TCP connect to each member's stable name, which a host that is there answers at once.

A member whose host answers may still never come: in bench/results/2026-12-01s notice120-0
two Ready joiners on a node that had returned 13 s before never entered generation 9's
rendezvous, and its six survivors waited 108 s, until the operator published the next
generation for another reason. So each rank sets its arrival key as it enters the rendezvous
(``StoreLayout.arrival_key``), and a formation still waiting after :data:`ABSENT_AFTER_S`
reads them: each member pod new in the generation (a replacement, a joiner: :class:`Absence`)
with a rank that has not arrived is reported (``absent``), once, provided this pod's own ranks
all have (else this pod may be the one that is late). A new member that the operator created
*with* the generation (not placed when it was published: ``Membership.placed``) must first be
scheduled, start and import torch, which took more than 30 s on a loaded machine (a
KeepSurvivors restart's replacement named absent and replaced once more, under six test
sessions at once): it is named only after the worker start timeout
(``TORCHJOB_WORKER_START_TIMEOUT_S``), the bound the runtime already sets on a start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from torchjob import contract
from torchjob.launch import Placement
from torchjob.launch.layout import StoreLayout
from torchjob.launch.settings import RuntimeSettings
from torchjob.launch.store_probe import HostsProbe, Probing, Silences, StoreProbe
from torchjob.train.recovery.membership import Membership

HOST = "host"
"""``SilentWorker.how``: its pod's address did not answer a connect (a sweep of the members'
hosts, :func:`torchjob.launch.store_probe.sweep`), once another member was found silent or
while the group formed."""
STORE = "store"
"""``SilentWorker.how``: the store it serves did not answer while the group formed."""
ABSENT = "absent"
"""``SilentWorker.how``: its host answered, but it never entered the generation's rendezvous
within :data:`ABSENT_AFTER_S` (it did not see the generation, or cannot reach the store)."""

ABSENT_AFTER_S = 30.0
"""How long a formation waits for every member to arrive before it names those that have
not. Arriving is entering the rendezvous, seconds after the generation is published (a
survivor stops at its next report; a joiner has imported already); a whole formation of 8
pods with 256 MiB restores took up to 22 s on 2 loaded cores (bench/results/2026-12-01s)."""
ARRIVALS_EVERY_S = 2.0
"""How often a waiting formation reads the arrivals (one request per rank)."""

Arrivals = Callable[[], "Collection[int] | None"]
"""The ranks that have arrived at the rendezvous, or None where the store cannot tell."""


@dataclass(frozen=True)
class Absence:
    """What a formation needs to name members that never arrive: who has (``arrived``), and
    the first rank of each member pod new in the generation (``newcomers``), the only ones
    it names. A survivor arrives only at its next report, minutes away for a long step; its
    silence is the heartbeat watchdog's and the host sweep's to find. Generation 0 has no
    newcomers: its pods start as their images come."""

    arrived: Arrivals
    newcomers: frozenset[int]
    starting: frozenset[int] = frozenset()
    """The newcomers created with the generation (not placed when it was published): they
    are named only after :attr:`starting_after_s`."""
    starting_after_s: float = ABSENT_AFTER_S


def peer_address(pod: contract.PodEnv, index: int) -> tuple[str, int]:
    """Where the pod of ``index`` of ``pod``'s job is probed: its stable name, at the
    rendezvous port (a host that is there answers even where nothing listens: a reset)."""
    return contract.worker_hostname(pod.job_name, index, pod.namespace), pod.rdzv_port


def peer_addresses(pod: contract.PodEnv, ranked: Sequence[int]) -> dict[int, tuple[str, int]]:
    """The first rank of every member pod of a generation (``ranked``: its pod indices in rank
    order) but ``pod`` itself and the store's host (rank 0's pod), with its address."""
    nproc = max(1, pod.nproc_per_node)
    return {
        place * nproc: peer_address(pod, index)
        for place, index in enumerate(ranked)
        if place > 0 and index != pod.pod_index
    }


def arrivals_reader(placement: Placement, generation: int, *, use_libuv: bool) -> Arrivals:
    """The arrivals of ``generation``'s rendezvous in the store ``placement`` names, read
    through a connection of the driver's own (``store_clients``, use ``formation``): None
    when the store does not answer within a few seconds (rank 0 not there yet, or silent:
    the store probe's to say)."""
    from torchjob.launch import store_clients

    layout = StoreLayout(
        placement.master_addr, placement.master_port, generation, use_libuv=use_libuv
    )
    keys = [layout.arrived_key(r) for r in range(placement.world_size)]
    quick = timedelta(seconds=2)

    def read() -> list[int] | None:
        try:
            store = store_clients.client(
                "formation", layout.addr, layout.port, connect=quick, timeout=quick,
                use_libuv=use_libuv,
            )  # fmt: skip
            return store_clients.within(
                2 * quick.total_seconds(),
                lambda: [r for r, k in enumerate(keys) if store.check([k])],
            )
        except Exception:  # refused, silent, timed out: the store cannot tell now
            store_clients.discard("formation", layout.addr, layout.port)
            return None

    return read


def newcomer_ranks(
    pod: contract.PodEnv, m: Membership, names: Collection[str] | None = None
) -> frozenset[int]:
    """The first rank of each member pod of ``m`` that is new in it (``Membership.joined``),
    or of each of ``names``."""
    nproc = max(1, pod.nproc_per_node)
    joined = set(m.joined if names is None else names)
    return frozenset(
        place * nproc
        for place, index in enumerate(m.ranked)
        if contract.worker_pod_name(pod.job_name, index) in joined
    )


def absence_of(
    pod: contract.PodEnv | None, placement: Placement, m: Membership | None, generation: int
) -> Absence | None:
    """What a pod's formation of ``generation`` (published as ``m``) needs to name the new
    members that never arrive; None on a laptop, alone, or with no new member but itself."""
    if pod is None or m is None or m.generation != generation or placement.world_size == 1:
        return None
    newcomers = newcomer_ranks(pod, m) - {placement.rank_offset}
    if not newcomers:
        return None
    settings = RuntimeSettings.from_env()
    starting = newcomers & newcomer_ranks(pod, m, set(m.joined) - set(m.placed))
    return Absence(
        arrivals_reader(placement, generation, use_libuv=settings.use_libuv),
        newcomers,
        starting,
        max(ABSENT_AFTER_S, settings.start_timeout_s),
    )


class FormationWatch:
    """While this pod's workers form a KeepSurvivors generation: the store's host, when
    another pod serves it, probed from the driver (``torchjob.launch.store_probe``), is
    reported silent as rank 0 (once) after ``silent_after_s`` of no answer; and once the
    formation has waited ``silent_after_s``, the other members' hosts (``peers``: first rank
    to address, :func:`peer_addresses`) are probed too, and each reported after
    ``silent_after_s`` of no answer (a node that vanished while the group formed: the
    heartbeat watchdog runs only once it has formed). The operator then publishes a
    generation without those pods, and the mode gives this formation up
    (``KeepSurvivorsMode.superseded``). Elsewhere (a laptop, the watchdog off) it does
    nothing."""

    def __init__(
        self,
        placement: Placement,
        report_silent: Callable[[int, float, str], None] | None,
        silent_after_s: float | None = None,
        probe: Callable[[tuple[str, int]], Probing] | None = None,
        *,
        peers: Mapping[int, tuple[str, int]] | None = None,
        probe_hosts: Callable[[Mapping[int, tuple[str, int]]], Silences[int]] | None = None,
        absence: Absence | None = None,
        absent_after_s: float = ABSENT_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        after = (
            RuntimeSettings.from_env().silent_peer_s if silent_after_s is None else silent_after_s
        )
        self.silent_after_s = after
        self.report_silent = report_silent if after > 0 else None
        self.reported: set[int] = set()
        self.probe: Probing | None = None
        self._peers = dict(peers or {}) if self.report_silent is not None else {}
        self._probe_hosts = probe_hosts or (lambda a: HostsProbe(a).start())
        self._hosts: Silences[int] | None = None
        self._clock = clock
        self._since = clock()
        if self.report_silent is not None and placement.rank_offset > 0:
            address = (placement.master_addr, placement.master_port)
            self.probe = (probe or (lambda a: StoreProbe(a).start()))(address)
        self._absence = absence if self.report_silent is not None else None
        self.absent_after_s = absent_after_s
        self._placement = placement
        self._read_at = -ARRIVALS_EVERY_S

    def _absent(self, waited: float) -> dict[int, float]:
        """The first rank of each other member pod new in the generation with a rank that has
        not arrived, once the formation has waited :attr:`absent_after_s` (a pod created with
        the generation: ``Absence.starting_after_s``) and this pod's own ranks have arrived."""
        a = self._absence
        if a is None or waited < self.absent_after_s:
            return {}
        now = self._clock()
        if now - self._read_at < ARRIVALS_EVERY_S:
            return {}
        self._read_at = now
        due = [
            first
            for first in sorted(a.newcomers)
            if waited >= (a.starting_after_s if first in a.starting else self.absent_after_s)
        ]
        if not due:
            return {}
        arrived = a.arrived()
        if arrived is None:
            return {}
        p = self._placement
        nproc = max(1, p.local_world_size)
        own = range(p.rank_offset, p.rank_offset + nproc)
        if not set(own) <= set(arrived):
            return {}  # this pod is late itself: it names nobody
        return {
            first: waited
            for first in due
            if first != p.rank_offset
            and not set(range(first, min(first + nproc, p.world_size))) <= set(arrived)
        }

    def _silent(self) -> dict[int, tuple[float, str]]:
        silent = {0: (self.probe.silent_for(), STORE)} if self.probe is not None else {}
        waited = self._clock() - self._since
        if self._peers and self._hosts is None and waited >= self.silent_after_s:
            self._hosts = self._probe_hosts(self._peers)
        if self._hosts is not None:
            silent.update((r, (s, HOST)) for r, s in self._hosts.silent().items())
        for rank, s in self._absent(waited).items():
            silent.setdefault(rank, (s, ABSENT))  # a silent host says more than its absence
        return silent

    def check(self, superseded: str | None = None) -> str | None:
        """Asked while the workers form: report each silent host's first rank once (rank 0:
        its store's host), and each member that never arrived; returns ``superseded`` (the
        mode's reason to give the formation up, if any)."""
        if self.report_silent is None:
            return superseded
        for rank, (silent, how) in sorted(self._silent().items()):
            due = self.absent_after_s if how == ABSENT else self.silent_after_s
            if silent >= due and rank not in self.reported:
                self.reported.add(rank)
                self.report_silent(rank, silent, how)
        return superseded

    def __enter__(self) -> FormationWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in (self.probe, self._hosts):
            if p is not None:
                p.stop()
