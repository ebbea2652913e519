"""torchjob.launch: the local launcher and in-pod agent that run worker processes.

Who uses it: ``torchjob.train.TorchTrainer.fit`` (Ray Train API), the RaySGD-style
``torchjob.sgd.PyTorchTrainer`` (stateful workers between ``train()`` calls) and tests.

Public API::

    group = WorkerGroup(num_workers, backend="auto", use_gpu=False, timeout_s=300.0,
                        placement=None, env=None, init_hook=None)
    group.start()                                # spawn, init_process_group, run init_hook
    group.execute(fn, *args, **kwargs) -> list   # fn on every worker; results by local rank
    group.execute_single(rank, fn, *args, **kwargs)
    group.submit(fn, args, kwargs).wait(on_event=..., on_tick=...)   # async form
    group.signal(signal.SIGTERM)                 # ask workers to stop at the next step
    group.shutdown(timeout_s=10)
    group.world_size, group.num_workers, group.pids, group.placement, group.is_broken

Inside a worker process (no-ops or ``None`` elsewhere)::

    worker_state() -> dict      # per-process, survives between execute() calls
    worker_info() -> WorkerInfo # rank, local_rank, world_size, ..., device
    send_event(payload)         # to the driver's on_event(rank, payload)
    stop_requested() -> bool    # this rank got SIGTERM
    regroup_requested() -> bool # the driver asked the group to re-form (REGROUP_SIGNAL)

Errors (``str(err)`` leads with the root-cause rank): :class:`WorkerGroupError`
(rank, exc_type, message, traceback_text), :class:`WorkerDiedError` (rank,
exitcode, signal), :class:`CollectiveTimeoutError` (rank, hung_ranks),
:class:`WorkerGroupStartError`; all subclass :class:`LaunchError`.

:class:`Placement` says where ranks live: ``Placement.local(n)`` on a laptop,
``Placement.from_pod_env(PodEnv.from_env())`` in a TorchJob pod.
Functions travel with cloudpickle, so lambdas and closures work.
Restart/shrink/grow decisions are pure functions in :mod:`torchjob.launch.policy`.
"""

from torchjob.contract import free_port
from torchjob.launch.errors import (
    CollectiveTimeoutError,
    LaunchError,
    WorkerDiedError,
    WorkerGroupError,
    WorkerGroupStartError,
    describe_exit,
)
from torchjob.launch.execution import Execution
from torchjob.launch.group import WorkerGroup
from torchjob.launch.placement import Placement
from torchjob.launch.startup import resolve_backend
from torchjob.launch.worker import (
    REGROUP_SIGNAL,
    WorkerInfo,
    regroup_requested,
    request_stop,
    send_event,
    stop_requested,
    worker_info,
    worker_state,
)

__all__ = [
    "REGROUP_SIGNAL",
    "CollectiveTimeoutError",
    "Execution",
    "LaunchError",
    "Placement",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerGroupStartError",
    "WorkerInfo",
    "describe_exit",
    "free_port",
    "regroup_requested",
    "request_stop",
    "resolve_backend",
    "send_event",
    "stop_requested",
    "worker_info",
    "worker_state",
]
