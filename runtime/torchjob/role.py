"""A pod's role in a published generation: a member (with its rank among the generation's
pods) or a standby. Pure, over pod indices and the generation the job's status publishes
(``currentGeneration``, ``replicas``, ``members``); ``torchjob.contract.pod_role`` and
``pod_as_of`` apply it to a pod's env. Re-exported by ``torchjob.contract``, like the rest of
the env contract; it imports nothing but the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


def rank_among(ranked: Sequence[int], pod_index: int) -> int | None:
    """Pod ``pod_index``'s rank among a generation's pods ``ranked`` (indices in rank order,
    ``status.members``): its place there; None when it is not a member."""
    return list(ranked).index(pod_index) if pod_index in ranked else None


class Published(Protocol):
    """A generation as the job's status publishes it (``currentGeneration``, ``replicas``,
    ``members``); ``torchjob.train.recovery.membership.Membership`` is one."""

    @property
    def generation(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    @property
    def members(self) -> tuple[int, ...] | None:
        """Pod indices in rank order; None: pods ``0..replicas-1``, rank ``i`` on pod ``i``."""


@dataclass(frozen=True)
class Member:
    """The generation names this pod: it forms the group with rank ``node_rank`` among the
    generation's ``replicas`` pods (its processes' ranks start at ``node_rank x nproc``)."""

    generation: int
    node_rank: int
    replicas: int


@dataclass(frozen=True)
class Standby:
    """The generation does not name this pod: a warm standby (``elastic.standbyReplicas``),
    a joiner created for a later generation, or a pod the job left out. It forms no group:
    its processes may start unformed, and it waits for a generation that names it."""

    generation: int


Role = Member | Standby
"""A pod's role in one generation, as data: match on it (``assert_never`` for the rest)."""


def ranked(published: Published) -> tuple[int, ...]:
    """The published generation's pod indices in rank order (``members``, else
    ``0..replicas-1``)."""
    return published.members if published.members is not None else tuple(range(published.replicas))


def role_in(published: Published, pod_index: int) -> Role:
    """Pod ``pod_index``'s role in a published generation: a member at its place in
    :func:`ranked`, else a standby."""
    order = ranked(published)
    rank = rank_among(order, pod_index)
    if rank is None:
        return Standby(published.generation)
    return Member(published.generation, rank, len(order))
