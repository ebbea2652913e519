"""WorkerGroup with real processes: collectives, per-process state, typed root-cause errors."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from tests.kube import scaled, wait_for

from torchjob.launch import (
    CollectiveTimeoutError,
    LaunchError,
    Placement,
    WorkerDiedError,
    WorkerGroup,
    WorkerGroupError,
    WorkerGroupStartError,
    free_port,
    send_event,
    worker_info,
    worker_state,
)


def _all_reduce_sum(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value])
    dist.all_reduce(t)
    return float(t.item())


def _rank() -> int:
    info = worker_info()
    assert info is not None
    return info.rank


def test_execute_runs_collectives_on_every_rank(group3: WorkerGroup) -> None:
    assert group3.world_size == 3
    assert group3.execute(_all_reduce_sum, 2.0) == [6.0, 6.0, 6.0]
    assert group3.execute(lambda: (_rank(), os.environ["RANK"])) == [(0, "0"), (1, "1"), (2, "2")]


def test_state_survives_between_calls(group3: WorkerGroup) -> None:
    group3.execute(lambda: worker_state().__setitem__("model", _rank() * 10))
    assert group3.execute(lambda: worker_state()["model"]) == [0, 10, 20]
    assert group3.execute_single(2, lambda: worker_state()["model"]) == 20


def test_events_reach_the_driver(group3: WorkerGroup) -> None:
    seen: list[tuple[int, object]] = []
    group3.submit(lambda: send_event({"rank": _rank()})).wait(
        on_event=lambda rank, payload: seen.append((rank, payload))
    )
    assert sorted(seen, key=lambda e: e[0]) == [(r, {"rank": r}) for r in range(3)]


def test_error_names_root_cause_rank(group3: WorkerGroup) -> None:
    def fail_on_rank_1() -> int:
        if _rank() == 1:
            raise ValueError("bad batch shape")
        return _rank()

    with pytest.raises(WorkerGroupError) as info:
        group3.execute(fail_on_rank_1)
    err = info.value
    assert (err.rank, err.exc_type, err.message) == (1, "ValueError", "bad batch shape")
    assert str(err).startswith("rank 1 raised ValueError: bad batch shape")
    assert "fail_on_rank_1" in err.traceback_text
    assert not group3.is_broken  # every rank returned: the group stays usable
    assert group3.execute(_rank) == [0, 1, 2]


def test_worker_death_is_root_cause_not_peer_errors() -> None:
    def die_on_rank_1() -> float:
        if _rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return _all_reduce_sum(1.0)

    with WorkerGroup(2, timeout_s=60) as group, pytest.raises(WorkerDiedError) as info:
        group.execute(die_on_rank_1)
    assert info.value.rank == 1
    assert info.value.signal == signal.SIGKILL
    assert "killed by SIGKILL" in str(info.value)


def test_hung_collective_times_out_naming_the_rank() -> None:
    def hang_on_rank_1() -> float:
        if _rank() == 1:
            time.sleep(60)
        return _all_reduce_sum(1.0)

    with WorkerGroup(2, timeout_s=3) as group, pytest.raises(CollectiveTimeoutError) as info:
        group.execute(hang_on_rank_1)
    assert info.value.rank == 1
    assert info.value.hung_ranks == [1]


def test_placement_offsets_ranks() -> None:
    # One "pod" running global ranks 2 and 3 of a world of 4 cannot form a group
    # alone; check the arithmetic the agent uses instead.
    placement = Placement(world_size=4, local_world_size=2, rank_offset=2, node_rank=1, num_nodes=2)
    assert [placement.rank_offset + i for i in range(placement.local_world_size)] == [2, 3]
    with pytest.raises(ValueError, match="do not fit"):
        Placement(world_size=4, local_world_size=2, rank_offset=3)


def test_a_rank_elsewhere_that_never_comes_is_waiting_for_peers_not_a_local_fault() -> None:
    """Rank 0 of a 2-rank world, alone on this host: the rendezvous cannot complete. A kept
    pod (KeepSurvivors) retries such a start instead of exiting as if it had failed."""
    placement = Placement(
        world_size=2,
        local_world_size=1,
        rank_offset=0,
        num_nodes=2,
        master_addr="127.0.0.1",
        master_port=free_port(),
    )
    group = WorkerGroup(1, timeout_s=3, placement=placement, start_timeout_s=60)
    with pytest.raises(WorkerGroupStartError) as info:
        group.start()
    assert info.value.waiting_for_peers, str(info.value)
    group.shutdown(timeout_s=0)

    def bad_hook() -> None:
        raise RuntimeError("no such dataset")

    # A start-up failure of this host's own workers is not waiting for anyone.
    local = WorkerGroup(1, timeout_s=30, init_hook=bad_hook)
    with pytest.raises(WorkerGroupStartError, match="no such dataset") as own:
        local.start()
    local.shutdown(timeout_s=0)
    assert not own.value.waiting_for_peers


def test_a_formation_waiting_for_a_store_that_never_answers_is_given_up_when_superseded() -> None:
    """Issue 39: rank 0's pod vanished with its node while the next generation formed; the
    pod of rank 1 would wait for rank 0's store up to the collective timeout (300 s here).
    Once ``abandon`` says the generation was superseded, the formation is given up at once:
    waiting for peers (a peer's loss, not this pod's fault), and its process is gone."""
    placement = _pod(1, 2, free_port(), generation=3)  # nothing serves rank 0's store
    group = WorkerGroup(1, timeout_s=300, placement=placement, start_timeout_s=60)
    seen: list[int] = []

    def abandon() -> str | None:
        seen.extend(p for p in group.pids if p not in seen)
        return "generation 4 was published" if seen else None  # once the worker runs

    group.abandon = abandon
    with pytest.raises(WorkerGroupStartError, match="generation 4 was published") as info:
        group.start()
    assert info.value.waiting_for_peers, str(info.value)
    assert "did not join" not in str(info.value)  # given up, not timed out
    assert seen, "the worker process ran"

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(lambda: all(gone(p) for p in seen), scaled(30), "the worker process gone")


def _pod(index: int, world: int, port: int, generation: int) -> Placement:
    """Pod ``index`` of a ``world``-pod job, one rank per pod, rendezvous on this host."""
    return Placement(
        world_size=world,
        local_world_size=1,
        rank_offset=index,
        node_rank=index,
        num_nodes=world,
        master_addr="127.0.0.1",
        master_port=port,
        generation=generation,
    )


def _reform_together(*moves: tuple[WorkerGroup, Placement]) -> None:
    """Re-form several "pods" at once (each ``reform`` blocks until its group is formed)."""
    errors: list[BaseException] = []

    def run(group: WorkerGroup, placement: Placement) -> None:
        try:
            group.reform(placement)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=m) for m in moves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def _remember(value: float) -> tuple[int, int, int, float]:
    """Keep ``value`` in this process; return (pid, rank, world size, sum over the group)."""
    info = worker_info()
    assert info is not None
    worker_state().setdefault("kept", value)
    return os.getpid(), info.rank, info.world_size, _all_reduce_sum(worker_state()["kept"])


def test_a_survivor_re_forms_in_place_when_a_peer_leaves_and_a_newcomer_joins() -> None:
    """KeepSurvivors' mechanism: pod 0's worker process outlives its peer. It re-forms the
    group alone (a shrink), then with a newcomer that started unformed (a grow), keeping
    its PID and what it holds in memory; the newcomer meets it under the new generation."""
    port = free_port()
    survivor = WorkerGroup(1, timeout_s=30, placement=_pod(0, 2, port, 0))
    leaver = WorkerGroup(1, timeout_s=30, placement=_pod(1, 2, port, 0))
    newcomer = WorkerGroup(1, timeout_s=30, placement=_pod(1, 2, port, 2))
    try:
        survivor.start(form=False)
        leaver.start(form=False)
        assert not survivor.formed
        _reform_together((survivor, _pod(0, 2, port, 0)), (leaver, _pod(1, 2, port, 0)))
        first = survivor.submit(_remember, (1.0,))
        assert leaver.execute(_remember, 2.0)[0][1:] == (1, 2, 3.0)
        ((pid, rank, world, total),) = first.wait()
        assert (rank, world, total) == (0, 2, 3.0)

        leaver.shutdown()  # the peer is evicted: generation 1 is pod 0 alone
        survivor.reform(_pod(0, 1, port, 1))
        assert survivor.execute(_remember, 9.0) == [(pid, 0, 1, 1.0)]  # same process, state kept

        newcomer.start(form=False)  # imports while the job runs smaller
        _reform_together((survivor, _pod(0, 2, port, 2)), (newcomer, _pod(1, 2, port, 2)))
        assert survivor.pids == [pid]
        grown = survivor.submit(_remember, (9.0,))
        assert newcomer.execute(_remember, 5.0)[0][1:] == (1, 2, 6.0)
        assert grown.wait() == [(pid, 0, 2, 6.0)]
    finally:
        for g in (survivor, leaver, newcomer):
            g.shutdown(timeout_s=0)


def test_a_group_that_cannot_re_form_says_so() -> None:
    group = WorkerGroup(1, timeout_s=30)
    with pytest.raises(LaunchError, match="cannot be re-formed"):
        group.reform(Placement.local(1))
    group.start()
    try:
        assert not group.can_reform(Placement.local(2))
    finally:
        group.shutdown()


def _all_reduce_forever(marker: str) -> None:
    _all_reduce_sum(1.0)
    Path(f"{marker}.{_rank()}").touch()  # this rank's first collective completed
    while True:
        _all_reduce_sum(1.0)


def _lose_the_peer(
    survivor: WorkerGroup, victim: WorkerGroup, port: int, tmp_path: Path
) -> WorkerGroupError:
    """Form the two one-rank groups into one, start an endless all-reduce on both, SIGKILL the
    victim's rank mid-loop, and return the survivor's failure."""
    survivor.start(form=False)
    victim.start(form=False)
    _reform_together((survivor, _pod(0, 2, port, 0)), (victim, _pod(1, 2, port, 0)))
    marker = tmp_path / "looping"
    running = survivor.submit(_all_reduce_forever, (str(marker),))
    victim.submit(_all_reduce_forever, (str(marker),))
    wait_for(lambda: Path(f"{marker}.1").exists(), 60, "the victim to enter its collective loop")
    os.kill(victim.pids[0], signal.SIGKILL)
    with pytest.raises(WorkerGroupError) as lost:
        running.wait()
    return lost.value


def test_a_gloo_survivor_of_a_vanished_peer_re_forms_in_place(tmp_path: Path) -> None:
    """A hard loss (the peer pod's process SIGKILLed mid-collective): the survivor's rank
    raises a broken connection, its process is sound, and it joins the next generation
    without a restart; a failure of its own would not allow that."""
    port = free_port()
    survivor = WorkerGroup(1, backend="gloo", timeout_s=30, placement=_pod(0, 2, port, 0))
    victim = WorkerGroup(1, backend="gloo", timeout_s=30, placement=_pod(1, 2, port, 0))
    newcomer = WorkerGroup(1, backend="gloo", timeout_s=30, placement=_pod(1, 2, port, 1))
    try:
        lost = _lose_the_peer(survivor, victim, port, tmp_path)
        pid = survivor.pids[0]
        assert lost.peer_failure, str(lost)
        assert survivor.is_broken and survivor.can_reform(_pod(0, 2, port, 1))

        newcomer.start(form=False)
        _reform_together((survivor, _pod(0, 2, port, 1)), (newcomer, _pod(1, 2, port, 1)))
        assert not survivor.is_broken
        back = survivor.submit(_remember, (1.0,))
        assert newcomer.execute(_remember, 2.0)[0][1:] == (1, 2, 3.0)
        assert back.wait() == [(pid, 0, 2, 3.0)]  # the same process
    finally:
        for g in (survivor, victim, newcomer):
            g.shutdown(timeout_s=0)


def test_a_broken_group_is_shut_down_without_waiting(tmp_path: Path) -> None:
    """A group broken by a peer's loss is not asked to exit (a worker may hang in a
    collective with the peer that is gone), so its shutdown kills at once instead of waiting
    out the timeout: a pod that stopped stayed 10 s longer, paid for and holding its name."""
    port = free_port()
    survivor = WorkerGroup(1, backend="gloo", timeout_s=30, placement=_pod(0, 2, port, 0))
    victim = WorkerGroup(1, backend="gloo", timeout_s=30, placement=_pod(1, 2, port, 0))
    try:
        _lose_the_peer(survivor, victim, port, tmp_path)
        assert survivor.is_broken
        pid = survivor.pids[0]
        killed: list[int] = []
        done = threading.Thread(
            target=lambda: killed.append(survivor.shutdown(timeout_s=3600)), daemon=True
        )
        done.start()
        done.join(timeout=60)
        assert not done.is_alive(), "the shutdown waited for a worker it never asked to exit"
        assert killed == [1]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        for g in (survivor, victim):
            g.shutdown(timeout_s=0)


_START_PROBE = """
import json, os, sys, threading
import torch
import xml.dom.minidom  # imported by this driver only: a copy of it has it, a fresh one not
from torchjob.launch import WorkerGroup, zygote

if sys.argv[1] == "threaded":  # a driver that runs a thread before its workers start
    threading.Thread(target=threading.Event().wait, daemon=True).start()

def probe():
    import torch
    import torch.distributed as dist
    from torchjob.launch.cuda_guard import cuda_touched

    t = torch.tensor([1.0])
    dist.all_reduce(t)
    maps = open(f"/proc/{os.getppid()}/maps").read()
    return {"pid": os.getpid(), "ppid": os.getppid(), "rank": os.environ["RANK"],
            "threads": torch.get_num_threads(), "sentinel": "xml.dom.minidom" in sys.modules,
            "sum": t.item(), "cuda": [torch.cuda.is_initialized(), cuda_touched(),
                                      "/libcuda.so" in maps]}

with WorkerGroup(2, backend="gloo") as g:
    out = {"method": g.start_method, "workers": g.execute(probe), "driver": os.getpid(),
           "zygotes": {k: z.pid for k, z in zygote._ZYGOTES.items()}}
print(json.dumps(out))
"""


@pytest.mark.parametrize("start", ["auto", "threaded", "spawn"])
def test_workers_come_from_a_zygote_that_never_touched_cuda_unless_told_not_to(start: str) -> None:
    """A single-threaded driver is copied into the zygote: the workers share its imports (no
    second ``import torch``); a threaded one gets a fresh zygote (it imported torch once, not
    the driver's other modules). Either way each worker has its own rank env, one intra-op
    thread, a group that works, and no CUDA state: not in itself, not in the zygote that
    forked it. ``spawn`` keeps fresh interpreters, children of the driver."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "TORCHJOB_WORKER_START": "spawn" if start == "spawn" else "auto"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, "-c", _START_PROBE, start],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(500),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    workers = out["workers"]
    assert [w["rank"] for w in workers] == ["0", "1"]
    assert all(w["sum"] == 2.0 and w["threads"] == 1 for w in workers), workers
    assert all(w["cuda"] == [False, None, False] for w in workers), workers
    if start == "spawn":
        assert out["method"] == "spawn"
        assert all(w["ppid"] == out["driver"] and not w["sentinel"] for w in workers), workers
        return
    kind = "copy" if start == "auto" else "fresh"
    assert out["method"] == "zygote"
    assert list(out["zygotes"]) == [kind]
    assert all(w["ppid"] == out["zygotes"][kind] for w in workers), workers
    assert all(w["sentinel"] is (kind == "copy") for w in workers), workers


def test_rank_0_serves_the_store_once_the_previous_holder_lets_the_port_go() -> None:
    """Rank 0 moves between pods; where "pods" share an address (the e2e process kubelet)
    the previous rank 0 may still hold the port for a moment: the new one waits for it, and
    gives up with the bind error after its timeout."""
    import socket
    from datetime import timedelta

    from torchjob.contract import free_port
    from torchjob.launch._worker_process import _serve_store

    port = free_port()
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    with pytest.raises(RuntimeError, match="in use"):
        _serve_store("127.0.0.1", port, timedelta(seconds=0.5), use_libuv=True)
    released = threading.Timer(0.5, holder.close)
    released.start()
    store = _serve_store("127.0.0.1", port, timedelta(seconds=30), use_libuv=True)
    released.join()
    store.set("k", "v")
    assert store.get("k") == b"v"


def _store_connection() -> tuple[int, int]:
    """(pid, identity of this process's rendezvous connection to the store)."""
    from torchjob.launch import store_clients

    key = ("rendezvous", os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    return os.getpid(), id(store_clients._clients[key])


def test_a_local_group_keeps_its_store_and_connections_when_rank_0_is_lost() -> None:
    """The driver serves a local group's store: rank 0's loss moves nothing, and the survivors
    re-form over the connections they already hold (new ones cost seconds at 32+ ranks)."""
    import torch.distributed  # noqa: F401  # the driver serves the store where it imported torch

    def die_on_rank_0() -> float:
        if _rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return _all_reduce_sum(1.0)

    with WorkerGroup(3, timeout_s=60) as group:
        port = group.placement.master_port
        before = dict(group.execute(_store_connection))
        assert len(before) == 3  # rank 0 connects as a client too
        with pytest.raises(WorkerDiedError) as info:
            group.execute(die_on_rank_0)
        assert info.value.rank == 0
        assert group.survivable()
        group.heal(3)
        # the same generation again: the driver's formations are keyed apart in its store
        group.reform(Placement.local(3))
        assert group.placement.master_port == port
        after = dict(group.execute(_store_connection))
        kept = set(before) & set(after)
        assert len(kept) == 2
        assert {pid: after[pid] for pid in kept} == {pid: before[pid] for pid in kept}
        assert group.execute(_all_reduce_sum, 1.0) == [3.0, 3.0, 3.0]


def test_a_rank_that_does_not_answer_after_a_failure_leaves_its_stack_in_the_log(
    capfd: pytest.CaptureFixture[str],
) -> None:
    def hang_on_rank_1() -> float:
        if _rank() == 1:
            time.sleep(60)
        return _all_reduce_sum(1.0)

    with WorkerGroup(2, timeout_s=3) as group, pytest.raises(CollectiveTimeoutError):
        group.execute(hang_on_rank_1)
    err = capfd.readouterr().err
    assert "rank(s) 1 did not answer" in err
    assert "in hang_on_rank_1" in err  # faulthandler's frame of the hung rank's main thread
