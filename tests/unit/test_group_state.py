"""A ``WorkerGroup``'s state (``torchjob.launch.group_state``): every transition from every
state, as a table, and what each state allows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from torchjob.launch.group_state import GroupState, InvalidTransition

S = GroupState
NO = None  # the transition is refused

TRANSITIONS: dict[str, Callable[[GroupState], GroupState]] = {
    "start": lambda s: s.started(form=True),
    "start-unformed": lambda s: s.started(form=False),
    "reform": lambda s: s.reformed(in_place=False),
    "reform-in-place": lambda s: s.reformed(in_place=True),
    "fail-hung": lambda s: s.failed(peer_loss_only=False, survivors=False),
    "fail-peer-lost": lambda s: s.failed(peer_loss_only=True, survivors=True),
    "fail-deaths": lambda s: s.failed(peer_loss_only=False, survivors=True),
    "heal": lambda s: s.healed(),
    "error": lambda s: s.errored(),
}

# state -> transition -> next state (None: refused)
TABLE: dict[GroupState, dict[str, GroupState | None]] = {
    S.NEW: {
        "start": S.FORMED,
        "start-unformed": S.WAITING,
        "reform": NO,
        "reform-in-place": NO,
        "fail-hung": NO,
        "fail-peer-lost": NO,
        "fail-deaths": NO,
        "heal": NO,
        "error": S.BROKEN,
    },
    **{
        state: {
            "start": S.FORMED,  # after a shutdown
            "start-unformed": S.WAITING,
            "reform": S.FORMED,
            "reform-in-place": S.FORMED,
            "fail-hung": S.BROKEN,
            "fail-peer-lost": S.PEER_LOST,
            "fail-deaths": S.SURVIVORS,
            "heal": S.WAITING,
            "error": S.BROKEN,
        }
        for state in (S.WAITING, S.FORMED)
    },
    S.PEER_LOST: {
        "start": S.FORMED,
        "start-unformed": S.WAITING,
        "reform": NO,  # an NCCL group without TORCHJOB_NCCL_REFORM
        "reform-in-place": S.FORMED,
        "fail-hung": S.BROKEN,
        "fail-peer-lost": S.PEER_LOST,
        "fail-deaths": S.SURVIVORS,
        "heal": S.WAITING,
        "error": S.BROKEN,
    },
    S.SURVIVORS: {
        "start": S.FORMED,
        "start-unformed": S.WAITING,
        "reform": NO,  # heal first
        "reform-in-place": NO,
        "fail-hung": S.BROKEN,
        "fail-peer-lost": S.PEER_LOST,
        "fail-deaths": S.SURVIVORS,
        "heal": S.WAITING,
        "error": S.BROKEN,
    },
    S.BROKEN: {
        "start": S.FORMED,
        "start-unformed": S.WAITING,
        "reform": NO,
        "reform-in-place": NO,
        "fail-hung": S.BROKEN,
        "fail-peer-lost": S.PEER_LOST,
        "fail-deaths": S.SURVIVORS,
        "heal": NO,  # shut it down
        "error": S.BROKEN,
    },
}


def test_the_table_covers_every_state_and_transition() -> None:
    assert set(TABLE) == set(GroupState)
    assert all(set(row) == set(TRANSITIONS) for row in TABLE.values())


@pytest.mark.parametrize(
    ("state", "transition", "after"),
    [
        pytest.param(state, name, after, id=f"{state.value}-{name}")
        for state, row in TABLE.items()
        for name, after in row.items()
    ],
)
def test_transition(state: GroupState, transition: str, after: GroupState | None) -> None:
    move = TRANSITIONS[transition]
    if after is None:
        with pytest.raises(InvalidTransition, match=f"from state {state.value}"):
            move(state)
    else:
        assert move(state) is after


@pytest.mark.parametrize(
    ("state", "broken", "formed", "keeps"),
    [
        pytest.param(S.NEW, False, False, True, id="new"),
        pytest.param(S.WAITING, False, False, True, id="waiting"),
        pytest.param(S.FORMED, False, True, True, id="formed"),
        pytest.param(S.PEER_LOST, True, True, True, id="peer-lost"),
        pytest.param(S.SURVIVORS, True, True, True, id="survivors"),
        pytest.param(S.BROKEN, True, True, False, id="broken"),
    ],
)
def test_what_each_state_says(state: GroupState, broken: bool, formed: bool, keeps: bool) -> None:
    assert (state.broken, state.formed, state.keeps_processes) == (broken, formed, keeps)
