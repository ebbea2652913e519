"""The launch layer's typed messages (``torchjob.launch.protocol``): the one ``Dispatcher``
both sides use, the worker's command loop and the driver's readers over a real pipe, and
that the messages stay plain picklable values."""

from __future__ import annotations

import dataclasses
import pickle
import re
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from torchjob.launch import protocol, startup, worker
from torchjob.launch.errors import WorkerGroupError, WorkerGroupStartError
from torchjob.launch.execution import _ANSWER, WorkerHandle
from torchjob.launch.protocol import (
    Dispatcher,
    Exit,
    Init,
    InitFailed,
    ProtocolError,
    Ready,
    Run,
    SilentPeer,
    TaskDone,
    TaskFailed,
    WorkerEvent,
    ignore,
)
from torchjob.launch.worker import WorkerProcess

RUNTIME = Path(__file__).resolve().parents[2] / "runtime" / "torchjob"


def test_the_dispatcher_calls_the_handler_of_the_messages_class_with_the_context() -> None:
    seen: list[tuple[Any, ...]] = []
    dispatch = Dispatcher[str](
        {Ready: lambda m, a, b: seen.append((m, a, b)) or "ready", Exit: lambda _m, *_: "exit"}
    )
    assert dispatch(Ready(), 1, 2) == "ready"
    assert seen == [(Ready(), 1, 2)]
    assert dispatch(Exit(), 1, 2) == "exit"
    with pytest.raises(ProtocolError, match="unexpected message Hello"):
        dispatch(protocol.Hello("t", 0, 1), 1, 2)
    # ``otherwise``: a user's event payload or a left-over reply, never an error
    lenient = Dispatcher[None]({Ready: lambda _m: None}, otherwise=ignore)
    assert lenient({"type": "mine"}) is None
    assert lenient.handles(Ready) and not lenient.handles(Exit)


def test_a_subclass_is_not_its_parents_message() -> None:
    class Special(SilentPeer):
        pass

    with pytest.raises(ProtocolError):
        Dispatcher[None]({SilentPeer: ignore})(Special(rank=1, silent_s=1.0, by=0, since=1.0))


MESSAGES = [
    Init(("/x",), "gloo", False, 30.0, None, form=False),
    protocol.Reform({"RANK": "1"}),
    Run(3, b"payload"),
    Exit(),
    protocol.Hello("token", 2, 1234),
    Ready(),
    InitFailed("RuntimeError", "boom", "tb", "user"),
    TaskDone(3, b"r"),
    TaskFailed(3, "ValueError", "bad", "tb", "user"),
    WorkerEvent(3, b"e"),
    SilentPeer(rank=1, silent_s=5.0, by=0, since=10.0),
    protocol.Report({"loss": 1.0}, "/c/1", 1, False, 2, 0, 1, True, 10),
    protocol.CheckpointLanded("/c/1", 1, 0),
    protocol.RestoredFromMemory(1, 0, 0.1, 100),
    protocol.RestoredFromMirror(1, 2, 1, (1,), 100, 0.1),
    protocol.MirrorFallback("why"),
    protocol.TrialReported({"x": 1}),
    protocol.TrialCheckpointed("/t"),
    protocol.ForkRequest(1, {"A": "b"}, "/", (0, 1, 2)),
    protocol.ZygoteReady(10, None),
    protocol.Forked(1, 11),
    protocol.Refused(1, "CUDA"),
    protocol.ChildExited(11, -9),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_is_a_frozen_value_that_pickles(msg: object) -> None:
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(msg)) == msg
    field = dataclasses.fields(msg)[0].name if dataclasses.fields(msg) else None  # type: ignore[arg-type]
    if field is not None:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(msg, field, None)
    # by reference to the module, never by value: cheap to send
    assert len(pickle.dumps(msg)) < 300


def _square(x: int) -> int:
    return x * x


def _boom() -> None:
    raise ValueError("mine")


def test_the_worker_loop_answers_the_drivers_commands_over_a_pipe() -> None:
    driver, end = Pipe()
    proc = WorkerProcess(conn=end)
    init = Init((), "gloo", False, 30.0, None)
    assert worker._COMMANDS(Run(7, cloudpickle.dumps((_square, (4,), {}))), proc, init) is True
    done = driver.recv()
    assert isinstance(done, TaskDone) and done.task_id == 7
    assert cloudpickle.loads(done.data) == 16
    assert worker._COMMANDS(Run(8, cloudpickle.dumps((_boom, (), {}))), proc, init) is True
    failed = driver.recv()
    assert isinstance(failed, TaskFailed)
    assert (failed.task_id, failed.exc_type, failed.message, failed.kind) == (
        8,
        "ValueError",
        "mine",
        "user",
    )
    assert worker._COMMANDS(Exit(), proc, init) is False
    with pytest.raises(ProtocolError):
        worker._COMMANDS(Ready(), proc, init)


class _Proc:
    pid = 1

    def poll(self) -> int | None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_the_driver_reads_a_tasks_answers_and_drops_an_abandoned_tasks() -> None:
    w = WorkerHandle(local_rank=0, rank=3, proc=_Proc())
    results: dict[int, Any] = {}
    events: list[tuple[int, Any]] = []

    def on_event(rank: int, payload: Any) -> None:
        events.append((rank, payload))

    def answer(msg: object) -> Any:
        return _ANSWER(msg, 5, w, results, lambda r, p: on_event(r, p))

    assert answer(TaskDone(4, cloudpickle.dumps("old"))) is None and results == {}
    assert answer(WorkerEvent(5, cloudpickle.dumps(SilentPeer(1, 2.0, 3, 4.0)))) is None
    assert events == [(3, SilentPeer(1, 2.0, 3, 4.0))]
    assert answer(TaskDone(5, cloudpickle.dumps("new"))) is None and results == {0: "new"}
    failure = answer(TaskFailed(5, "RuntimeError", "gloo: connection closed", "tb", "peer"))
    assert failure.kind == "peer" and isinstance(failure.error, WorkerGroupError)
    assert failure.error.rank == 3


def test_a_worker_that_failed_to_form_is_named_and_leftovers_are_skipped() -> None:
    w = WorkerHandle(local_rank=0, rank=2, proc=_Proc())
    assert startup._FORMED(Ready(), w) is True
    assert startup._FORMED(TaskDone(1, b""), w) is False  # left over from an abandoned task
    with pytest.raises(WorkerGroupStartError, match="rank 2 failed to initialize: E: m") as info:
        startup._FORMED(InitFailed("E", "m", "tb", "timeout"), w)
    assert info.value.waiting_for_peers


def test_no_message_is_a_string_tagged_tuple_any_more() -> None:
    """Nothing in the launch layer builds or matches a message tag, and torchjob's own
    events are typed wherever they are sent."""
    tagged = re.compile(r"""\.send\(\(["']|(msg|reply|hello)\[[0-9]\]|["']type["']""")
    untyped_event = re.compile(r"send_event\(\s*\{")
    offenders = [
        f"{path.relative_to(RUNTIME)}:{n}"
        for folder in ("launch", "train", "tune")
        for path in sorted((RUNTIME / folder).glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if untyped_event.search(line) or (folder == "launch" and tagged.search(line))
    ]
    assert offenders == []
