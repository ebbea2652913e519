"""The worker process: joins the process group, then runs functions the driver sends it.

Started by :class:`torchjob.launch.WorkerGroup` as ``python -m torchjob.launch._entry``
(a fresh interpreter, like torchrun's workers) or forked (``torchjob.launch._start``), so a
user's script is never re-imported in the workers and Ray's top-level ``trainer.fit()``
snippets work without an ``if __name__ == "__main__"`` guard. Functions arrive cloudpickled,
so lambdas and closures from scripts and tests run too.

What the process holds is one :class:`~torchjob.launch._worker_process.WorkerProcess`
(its connection, its place in the group, :func:`worker_state`, its stop flag): :func:`main`
makes a fresh one, so a worker forked from a zygote never sees its parent's. The messages
are ``torchjob.launch.protocol``'s.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from torchjob.launch import malloc
from torchjob.launch._worker_process import Abandon, Leave, WorkerInfo, WorkerProcess
from torchjob.launch.protocol import (
    Dispatcher,
    Exit,
    Hello,
    Init,
    InitFailed,
    ProtocolError,
    Ready,
    Reform,
    Run,
    TaskDone,
    TaskFailed,
)

__all__ = [
    "REGROUP_SIGNAL",
    "STACK_SIGNAL",
    "WorkerInfo",
    "WorkerProcess",
    "clear_stop",
    "current",
    "main",
    "regroup_requested",
    "request_stop",
    "send_event",
    "stop_requested",
    "worker_info",
    "worker_state",
]

STACK_SIGNAL = signal.SIGUSR2
"""Makes a worker write every thread's Python stack to stderr (faulthandler): the driver
sends it to the ranks that do not answer after a failure (``execution._dump_stacks``)."""

REGROUP_SIGNAL = signal.SIGUSR1
"""Asks a worker to end its group at the next report so that the group re-forms (a new
generation: a pod joins or leaves), not to stop: :func:`regroup_requested`."""

_process = WorkerProcess()
"""This process's worker state: a blank one until :func:`main` makes the worker's own."""


def current() -> WorkerProcess:
    """This process's :class:`WorkerProcess` (a blank one outside a worker process)."""
    return _process


def worker_state() -> dict[str, Any]:
    """A dict private to this worker process that lives as long as the process.

    ``execute`` calls on the same group see the same dict, so a trainer can keep
    its model, optimizer and data loaders here between calls.
    """
    return _process.state


def worker_info() -> WorkerInfo | None:
    """This process's place in the group; ``None`` outside a worker process."""
    return _process.info


def stop_requested() -> bool:
    """True once this worker received SIGTERM (or the driver asked it to stop).

    Only *this* rank knows; the trainer all-reduces the flag so all ranks stop at
    the same step.
    """
    return _process.stop.is_set()


def regroup_requested() -> bool:
    """True once the driver asked this worker's group to re-form (``REGROUP_SIGNAL``): the
    next report ends the generation without the loop's stop, when every rank holds its
    restore point (``torchjob.train.report``); else it is a stop like SIGTERM's."""
    return _process.regroup.is_set()


def request_stop() -> None:
    """Set this worker's stop flag (what the SIGTERM handler does)."""
    _process.stop.set()


def clear_stop() -> None:
    _process.stop.clear()
    _process.regroup.clear()


def send_event(payload: Any) -> bool:
    """Send ``payload`` to the driver while a function runs; False outside a worker.

    The driver receives it in :meth:`Execution.wait`'s ``on_event(rank, payload)``.
    torchjob's own payloads are ``torchjob.launch.protocol``'s event classes.
    """
    return _process.send_event(payload)


def _watch_parent(driver_pid: int) -> None:
    """Exit when the driver is gone, so no orphan keeps a port or a GPU. The driver is the
    parent, or (a worker forked by the zygote) named by ``TORCHJOB_LAUNCH_DRIVER_PID``."""
    try:
        fd = os.pidfd_open(driver_pid)  # readable once the driver exits; no pid reuse
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        select.select([fd], [], [])
        os._exit(70)
    while True:
        if os.getppid() != driver_pid:
            try:
                os.kill(driver_pid, 0)
            except ProcessLookupError:
                os._exit(70)
        time.sleep(1.0)


def _warm_up() -> None:
    """A process waiting to be formed imports what the first step needs meanwhile:
    DDP's constructor imports the compiler stack (seconds of CPU), and so does
    ``torch.compiler.reset()``, the public way to load it (nothing is compiled yet)."""
    import torch.compiler
    import torch.distributed
    import torch.nn.parallel

    torch.compiler.reset()


def _connect(proc: WorkerProcess) -> Connection:
    host, port = proc.env.driver_addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.settimeout(None)
    return Connection(sock.detach())


def _start(init: Init, proc: WorkerProcess) -> bool:
    """Form (or warm up) and run the init hook; False (after telling the driver) if it failed."""
    sys.path[:] = list(init.sys_path)
    try:
        if init.form:
            proc.form(init)
        else:
            _warm_up()
        if init.init_hook is not None:
            hook: Callable[[], None] = cloudpickle.loads(init.init_hook)
            hook()
    except BaseException as exc:
        proc.send(InitFailed.of(exc))
        return False
    proc.send(Ready())
    return True


def _run(msg: Run, proc: WorkerProcess, _init: Init) -> bool:
    """Run the task; answer with the id of the task that ends: a task parked when its group
    broke (``WorkerProcess.park``) may go on as the driver's next one, or give way to it."""
    while True:
        proc.task_id = msg.task_id
        try:
            fn, args, kwargs = cloudpickle.loads(msg.payload)
            result = fn(*args, **kwargs)
            data = cloudpickle.dumps(result)
        except Abandon as gave_way:
            msg = gave_way.run
            del gave_way  # its traceback holds the parked task's frames (a model, its state)
            continue
        except Leave:
            return False
        except BaseException as exc:
            proc.leave_broken_group(exc)
            proc.send(TaskFailed.of(proc.task_id, exc))
            return True
        proc.send(TaskDone(proc.task_id, data))
        return True


def _reform(msg: Reform, proc: WorkerProcess, init: Init) -> bool:
    try:
        proc.reform(init, msg.env)
    except BaseException as exc:
        proc.send(InitFailed.of(exc))
        return True
    proc.send(Ready())
    return True


def _exit(_msg: Exit, _proc: WorkerProcess, _init: Init) -> bool:
    return False


_COMMANDS = Dispatcher[bool]({Run: _run, Reform: _reform, Exit: _exit})
"""The driver's commands after :class:`Init`: each handler answers whether to go on."""


def main() -> int:
    """The worker's life: connect, say hello, start as :class:`Init` says, then answer the
    driver's commands until :class:`Exit` or its connection closes."""
    global _process
    proc = _process = WorkerProcess.from_env()
    malloc.tune(os.environ, enabled=proc.settings.malloc_tuning)  # before any step allocates
    signal.signal(signal.SIGTERM, lambda _s, _f: proc.stop.set())
    signal.signal(REGROUP_SIGNAL, lambda _s, _f: proc.regroup.set())
    # Every thread's stack to stderr on the driver's request (a rank that did not answer).
    faulthandler.register(STACK_SIGNAL, file=2, all_threads=True)  # fd 2: the job log
    conn = proc.conn = _connect(proc)
    conn.send(Hello(proc.env.token, proc.env.local_rank, os.getpid()))
    driver = proc.env.driver_pid or os.getppid()
    threading.Thread(target=_watch_parent, args=(driver,), daemon=True).start()
    init = conn.recv()
    if not isinstance(init, Init):
        raise ProtocolError(f"a worker's first message must be Init, got {init!r}"[:300])
    proc.init = init
    if not _start(init, proc):
        return 1
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if not _COMMANDS(msg, proc, init):
            break
    return 0
