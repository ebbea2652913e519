"""While a KeepSurvivors generation forms: which of its members' hosts answer.

The heartbeat watchdog (``torchjob.launch.heartbeat``) runs only once a group has formed;
until then, every worker waits for rank 0's store up to the collective timeout, and a member
whose node vanished in that window is found only by the node controller, ~40 s later.
:class:`FormationWatch` probes from the driver instead (``torchjob.launch.store_probe``): a
TCP connect to each member's stable name, which a host that is there answers at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from torchjob import contract
from torchjob.launch import Placement
from torchjob.launch.settings import RuntimeSettings
from torchjob.launch.store_probe import HostsProbe, Probing, Silences, StoreProbe

HOST = "host"
"""``SilentWorker.how``: its pod's address did not answer a connect (a sweep of the members'
hosts, :func:`torchjob.launch.store_probe.sweep`), once another member was found silent or
while the group formed."""
STORE = "store"
"""``SilentWorker.how``: the store it serves did not answer while the group formed."""


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

    def _silent(self) -> dict[int, float]:
        silent = {0: self.probe.silent_for()} if self.probe is not None else {}
        waited = self._clock() - self._since
        if self._peers and self._hosts is None and waited >= self.silent_after_s:
            self._hosts = self._probe_hosts(self._peers)
        if self._hosts is not None:
            silent.update(self._hosts.silent())
        return silent

    def check(self, superseded: str | None = None) -> str | None:
        """Asked while the workers form: report each silent host's first rank once (rank 0:
        its store's host); returns ``superseded`` (the mode's reason to give the formation
        up, if any)."""
        if self.report_silent is None:
            return superseded
        for rank, silent in sorted(self._silent().items()):
            if silent >= self.silent_after_s and rank not in self.reported:
                self.reported.add(rank)
                self.report_silent(rank, silent, STORE if rank == 0 else HOST)
        return superseded

    def __enter__(self) -> FormationWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in (self.probe, self._hosts):
            if p is not None:
                p.stop()
