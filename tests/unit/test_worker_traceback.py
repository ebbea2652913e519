"""A training function's error shows where it was raised: the worker's traceback is the
cause of the driver's ``WorkerGroupError`` (``torchjob.launch.errors.RemoteTraceback``), so
a failed ``fit()`` prints the user's line above the driver's frames, and it survives the
pickling that carries the error between processes (a trial's, a pod's)."""

from __future__ import annotations

import pickle
import traceback

from torchjob.launch.errors import RemoteTraceback, WorkerGroupError
from torchjob.launch.protocol import TaskFailed


def _users_code(config: dict[str, object]) -> object:
    return config["missing"].values()  # type: ignore[attr-defined]


def _failed_in_worker() -> TaskFailed:
    try:
        _users_code({"missing": None})
    except AttributeError as exc:
        return TaskFailed.of(3, exc)
    raise AssertionError("did not raise")


def test_the_worker_s_traceback_is_printed_with_the_driver_s_error() -> None:
    failed = _failed_in_worker()
    err = WorkerGroupError(0, failed.exc_type, failed.message, failed.traceback)
    assert isinstance(err.__cause__, RemoteTraceback)
    printed = "".join(traceback.format_exception(err))
    assert "in _users_code" in printed and 'config["missing"].values()' in printed
    assert printed.index("in _users_code") < printed.index("WorkerGroupError: rank 0 raised")
    assert str(err).startswith("rank 0 raised AttributeError"), "the first line stays the cause"


def test_it_survives_pickling_and_is_absent_without_a_traceback() -> None:
    failed = _failed_in_worker()
    err = pickle.loads(
        pickle.dumps(WorkerGroupError(2, failed.exc_type, failed.message, failed.traceback))
    )
    assert isinstance(err.__cause__, RemoteTraceback) and "_users_code" in str(err.__cause__)
    assert WorkerGroupError(1, "ValueError", "boom").__cause__ is None
