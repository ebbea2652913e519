"""``in_place.decide``: whether the parked ranks of a re-formed group go on inside their
training function, and whether they keep their live state, from every rank's note."""

from __future__ import annotations

import pytest

from torchjob.train.recovery.in_place import Parked, decide, fresh_at


def whole(mark: int, joinable: bool = True) -> Parked:
    """Parked in ``should_stop()`` after the whole step that follows report ``mark``."""
    return Parked(mark, exact=False, joinable=joinable)


def broken(joinable: bool = True) -> Parked:
    """Parked after a step the loss broke."""
    return Parked(-1, exact=False, joinable=joinable)


def undone(mark: int, joinable: bool = True) -> Parked:
    """Parked after the step the loss broke, undone to report ``mark`` (``step_undo``)."""
    return Parked(mark, exact=True, joinable=joinable, undone=True)


def at(mark: int, joinable: bool = True) -> Parked:
    """Parked at the end of a regroup's report ``mark``, its restore point taken."""
    return Parked(mark, exact=True, joinable=joinable)


@pytest.mark.parametrize(
    ("notes", "index", "expected"),
    [
        # A shrink: every rank parked.
        pytest.param([whole(7), whole(7)], 7, (True, 7), id="all-whole-same-report-kept"),
        pytest.param([whole(7), broken()], 7, (True, None), id="one-broken-rolls-back"),
        pytest.param([whole(7), whole(6)], 7, (True, None), id="unlike-reports-roll-back"),
        pytest.param([broken(), broken()], 7, (True, None), id="all-broken-roll-back"),
        pytest.param([at(9), at(9)], 9, (True, 9), id="all-at-a-regroup-report-kept"),
        # The same report number, one after its whole step, one at it: unlike live states.
        pytest.param([at(7), whole(7)], 7, (True, None), id="at-and-after-report-roll-back"),
        # The step the loss broke, undone: the live state is that of the report.
        pytest.param([undone(7), undone(7)], 3, (True, 7), id="all-undone-same-report-kept"),
        pytest.param([undone(7), at(7)], 7, (True, 7), id="undone-and-at-the-report-kept"),
        pytest.param([undone(7), undone(6)], 7, (True, None), id="undone-unlike-roll-back"),
        pytest.param([undone(7), broken()], 7, (True, None), id="undone-and-broken-roll-back"),
        pytest.param([undone(7), whole(7)], 7, (True, None), id="undone-and-whole-roll-back"),
        pytest.param([undone(7), undone(7), None], 7, (True, 7), id="join-undone-at-rp-kept"),
        pytest.param(
            [undone(7), undone(7), None], 3, (True, None), id="join-undone-older-rp-rolls-back"
        ),
        # A rank joins afresh (None): it loads the restore point, so the parked keep their
        # live state only where it is that restore point.
        pytest.param([at(9), at(9), None], 9, (True, 9), id="grow-at-the-restore-point-kept"),
        pytest.param(
            [whole(9), whole(9), None], 9, (True, None), id="join-after-a-step-rolls-back"
        ),
        pytest.param([at(8), at(8), None], 9, (True, None), id="join-older-report-rolls-back"),
        pytest.param([broken(), None], 4, (True, None), id="replacement-rolls-back"),
        # Not in place.
        pytest.param([at(9), at(9, joinable=False), None], 9, (False, None), id="unjoinable"),
        pytest.param([whole(7), whole(7)], None, (False, None), id="no-restore-point"),
        pytest.param([None, None], 3, (False, None), id="none-parked"),
    ],
)
def test_decide(notes: list[Parked | None], index: int | None, expected: tuple) -> None:
    assert decide(notes, index) == expected


def test_an_unjoinable_group_still_goes_on_in_place_when_nobody_joins() -> None:
    # joinable only matters to a rank run afresh: survivors alone re-form in place as before.
    assert decide([whole(3, joinable=False), whole(3, joinable=False)], 3) == (True, 3)


@pytest.mark.parametrize(
    ("notes", "indices", "expected"),
    [
        # A replacement joins survivors that undid their step after report 7, the restore
        # point held being report 3's: they take report 7's now, and it is sent.
        pytest.param([undone(7), undone(7), None], [3, 3, -1], 7, id="undone-newer-taken"),
        pytest.param([undone(7), undone(7), None], [7, 7, -1], None, id="held-already"),
        pytest.param([undone(7), undone(7)], [3, 3], None, id="nobody-joins-kept-anyway"),
        pytest.param([undone(7), undone(6), None], [3, 3, -1], None, id="unlike-reports"),
        pytest.param([undone(7), broken(), None], [3, 3, -1], None, id="one-broken"),
        pytest.param([whole(7), whole(7), None], [3, 3, -1], None, id="after-a-whole-step"),
        pytest.param(
            [undone(7), undone(7, joinable=False), None], [3, 3, -1], None, id="unjoinable"
        ),
        pytest.param([None, None], [3, -1], None, id="none-parked"),
    ],
)
def test_fresh_at(notes: list[Parked | None], indices: list[int], expected: int | None) -> None:
    assert fresh_at(notes, indices) == expected
    if expected is not None:  # then decide keeps the live state at that restore point
        assert decide(notes, expected) == (True, expected)
