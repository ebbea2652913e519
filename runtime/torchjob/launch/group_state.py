"""A ``WorkerGroup``'s state: one enum and the transitions between its states (pure).

::

    NEW --start(form=True)--> FORMED          NEW --start(form=False)--> WAITING
    WAITING | FORMED | PEER_LOST --reform--> FORMED
    WAITING | FORMED --a failed execution--> BROKEN | PEER_LOST | SURVIVORS
    any but BROKEN --heal--> WAITING          (a reform then forms the next group)
    any --a failed reform, heal or send--> BROKEN

``PEER_LOST``: every local rank answered, each with a broken connection to another host (the
processes are sound: ``WorkerGroup.can_reform``). ``SURVIVORS``: every local rank answered,
each dead or with a broken connection (the live ones are sound: ``WorkerGroup.heal``).
``BROKEN``: anything else (a rank hung, raised its own error, or a re-formation failed):
shut it down. Shutting a group down leaves its state as it was (``is_broken`` still says how
it ended).
"""

from __future__ import annotations

from enum import Enum


class GroupState(Enum):
    NEW = "new"
    """Not started."""
    WAITING = "waiting"
    """Started, its processes in no group yet (``start(form=False)``, or healed): a
    ``reform`` forms it."""
    FORMED = "formed"
    """In a process group: runs functions."""
    BROKEN = "broken"
    """A failure of its own: peers may be stuck in a collective; shut it down."""
    PEER_LOST = "peer_lost"
    """Broken only because ranks on other hosts vanished: it re-forms in place."""
    SURVIVORS = "survivors"
    """Broken by deaths and broken connections only: its live processes heal."""

    @property
    def broken(self) -> bool:
        """A failed execution left it: it runs nothing more (``WorkerGroup.is_broken``)."""
        return self in (GroupState.BROKEN, GroupState.PEER_LOST, GroupState.SURVIVORS)

    @property
    def formed(self) -> bool:
        """Its processes are (or, broken, were) in a process group."""
        return self is GroupState.FORMED or self.broken

    @property
    def keeps_processes(self) -> bool:
        """Its live processes are sound (``WorkerGroup.survivable``): not broken, or broken
        by lost peers and deaths only."""
        return self is not GroupState.BROKEN

    def reformable(self, *, in_place: bool) -> bool:
        """Whether its processes may join the next group as they are (``WorkerGroup.reform``):
        not broken, or broken by other hosts' lost ranks where the backend re-forms in place
        (``in_place``: ``nccl.in_place``)."""
        return not self.broken or (self is GroupState.PEER_LOST and in_place)

    # --- the transitions ---------------------------------------------------------------------
    def started(self, *, form: bool) -> GroupState:
        """``start``: formed at once, or waiting for a ``reform`` (``form=False``)."""
        return GroupState.FORMED if form else GroupState.WAITING

    def reformed(self, *, in_place: bool) -> GroupState:
        """A ``reform`` that succeeded."""
        if self is GroupState.NEW or not self.reformable(in_place=in_place):
            raise InvalidTransition(self, "reform")
        return GroupState.FORMED

    def failed(self, *, peer_loss_only: bool, survivors: bool) -> GroupState:
        """A failed execution (``Execution.wait`` says how it failed): ``peer_loss_only``,
        every local rank answered with a broken connection to another host; ``survivors``,
        every local rank answered, dead or with a broken connection."""
        if self is GroupState.NEW:
            raise InvalidTransition(self, "fail")
        if peer_loss_only:
            return GroupState.PEER_LOST
        return GroupState.SURVIVORS if survivors else GroupState.BROKEN

    def healed(self) -> GroupState:
        """A ``heal`` that kept the live processes and started new ones (unformed)."""
        if self is GroupState.NEW or not self.keeps_processes:
            raise InvalidTransition(self, "heal")
        return GroupState.WAITING

    def errored(self) -> GroupState:
        """A re-formation, a heal or a send to a worker failed: shut it down."""
        return GroupState.BROKEN


class InvalidTransition(RuntimeError):
    """A transition a state does not allow (a bug of the caller: ``WorkerGroup`` checks
    ``can_reform``/``survivable`` first)."""

    def __init__(self, state: GroupState, transition: str) -> None:
        super().__init__(f"a worker group cannot {transition} from state {state.value}")
        self.state = state
        self.transition = transition
