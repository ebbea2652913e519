"""The rendezvous store's key layout: where one generation's keys live, in one place.

Every generation of a group meets in one ``TCPStore`` (rank 0's, or the driver's for a
local group: ``torchjob.launch.worker``) and keeps its keys under its own prefix, so that a
re-formed group never reads a previous one's keys:

==============================  ==========================================================
``torchjob/g{gen}``             the rendezvous of ``init_process_group`` (rank 0 serves it)
``torchjob/g{gen}/f{n}``        the same where the driver serves the store: its n-th formation
``<rendezvous>/arrived/{rank}``  set by each rank as it enters the rendezvous (``formation``)
``torchjob/g{gen}/hb/{rank}``   each rank's heartbeat (``heartbeat``, ``driver_beat``)
``torchjob/g{gen}/group/abort`` the generation's abort key (``abort``, NCCL groups)
``torchjob/probe``              the key a kept connection is probed with (``store_clients``)
==============================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

ROOT: Final = "torchjob"


@dataclass(frozen=True)
class StoreLayout:
    """One generation's keys in the store at ``addr:port``."""

    addr: str
    port: int
    generation: int
    formation: int = 0
    """``N`` > 0: the driver serves the store, and this is its N-th formation there."""
    use_libuv: bool = True
    """How to connect: TCPStore's libuv backend (``RuntimeSettings.use_libuv``)."""

    PROBE_KEY: ClassVar[str] = f"{ROOT}/probe"
    ARRIVED: ClassVar[str] = "arrived"
    """Under :attr:`rendezvous`: each rank's key as it enters the rendezvous, so that a
    formation that waits can tell which members never came
    (``torchjob.train.recovery.formation``)."""
    ABORT_KEY: ClassVar[str] = "abort"
    """Under :attr:`group`: set by the driver when it sees a worker die (NCCL groups)."""

    @property
    def generation_prefix(self) -> str:
        return f"{ROOT}/g{self.generation}"

    @property
    def rendezvous(self) -> str:
        """The prefix of ``init_process_group``'s keys (one per formation where the driver
        serves the store: a WorkerGroup may re-form into the same generation)."""
        base = self.generation_prefix
        return f"{base}/f{self.formation}" if self.formation else base

    @property
    def heartbeat(self) -> str:
        """The prefix of the ranks' beats: the key of rank ``r`` is ``str(r)`` under it."""
        return f"{self.generation_prefix}/hb"

    @property
    def group(self) -> str:
        """The prefix of the generation's group keys (:attr:`ABORT_KEY`)."""
        return f"{self.generation_prefix}/group"

    @staticmethod
    def beat_key(rank: int) -> str:
        return str(rank)

    @classmethod
    def arrival_key(cls, rank: int) -> str:
        """Rank ``rank``'s arrival, under :attr:`rendezvous` (a worker's prefixed store)."""
        return f"{cls.ARRIVED}/{rank}"

    def arrived_key(self, rank: int) -> str:
        """Rank ``rank``'s arrival as the whole key (a client of the store itself)."""
        return f"{self.rendezvous}/{self.arrival_key(rank)}"


def prefixed(prefix: str, store: Any) -> Any:
    """``store`` seen under ``prefix`` (a ``torch.distributed.PrefixStore``)."""
    import torch.distributed as dist

    return dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]
