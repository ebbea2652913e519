"""A forming group's store host, probed from the driver (``torchjob.launch.store_probe``), and
the watch that reports it silent as rank 0 (``FormationWatch``).

Real sockets on the loopback: a listener that accepts answers; a closed port answers with a
reset (its host is there, the store is late); a listener whose accept queue is full drops
the SYN (nothing answers: what a vanished node's address does) and the connect times out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator, Mapping

import pytest
from tests.unit.builders import pod_env

from torchjob.launch import Placement
from torchjob.launch.layout import StoreLayout, prefixed
from torchjob.launch.settings import RuntimeSettings
from torchjob.launch.store_probe import (
    HostsProbe,
    StoreProbe,
    answered,
    await_listening,
    sweep,
)
from torchjob.train.recovery.formation import (
    ABSENT_AFTER_S,
    Absence,
    FormationWatch,
    absence_of,
    arrivals_reader,
    newcomer_ranks,
    peer_addresses,
)
from torchjob.train.recovery.membership import Membership


@pytest.fixture
def silent_address() -> Iterator[tuple[str, int]]:
    """A port whose SYNs are dropped: a listener that never accepts, its queue filled."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    address = srv.getsockname()
    filling = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(address)
        filling.append(c)
    yield address
    for c in filling:
        c.close()
    srv.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_a_host_that_accepts_or_refuses_answers_and_a_dropped_syn_does_not(
    silent_address: tuple[str, int],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        assert answered(srv.getsockname(), 1.0) is True
    assert answered(("127.0.0.1", _closed_port()), 1.0) is True, "a reset: there, but late"
    assert answered(silent_address, 0.3) is False
    assert answered(("no-such-host.invalid", 29500), 0.3) is None, "our network, not the peer"


def test_the_silence_is_timed_from_the_first_of_an_unbroken_run_of_timeouts() -> None:
    now = [100.0]
    probe = StoreProbe(("h", 1), clock=lambda: now[0])
    probe.observe(False, 100.0)
    now[0] = 101.0
    probe.observe(None, 101.0)  # could not ask: neither breaks nor starts the run
    probe.observe(False, 101.0)
    now[0] = 104.0
    assert probe.silent_for() == 4.0
    probe.observe(True, 104.0)
    assert probe.silent_for() == 0.0
    probe.observe(None, 104.5)
    assert probe.silent_for() == 0.0


def test_the_probe_thread_finds_a_silent_store(silent_address: tuple[str, int]) -> None:
    probe = StoreProbe(silent_address, every_s=0.1, timeout_s=0.2).start()
    try:
        deadline = time.monotonic() + 30
        while probe.silent_for() < 0.5:
            assert time.monotonic() < deadline, "the probe never found the store silent"
            time.sleep(0.05)
    finally:
        probe.stop()


class _Probe:
    def __init__(self) -> None:
        self.silent = 0.0
        self.stopped = False

    def silent_for(self) -> float:
        return self.silent

    def stop(self) -> None:
        self.stopped = True


def _placement(rank_offset: int) -> Placement:
    return Placement(
        world_size=4,
        local_world_size=1,
        rank_offset=rank_offset,
        node_rank=rank_offset,
        num_nodes=4,
        master_addr="job-worker-0.job",
        master_port=29500,
    )


def test_a_silent_store_host_is_reported_once_as_rank_0_and_the_reason_passed_through() -> None:
    reports: list[tuple[int, float, str]] = []
    probes: list[_Probe] = []

    def make(address: tuple[str, int]) -> _Probe:
        assert address == ("job-worker-0.job", 29500)
        probes.append(_Probe())
        return probes[-1]

    with FormationWatch(
        _placement(2),
        lambda r, s, how: reports.append((r, s, how)),
        5.0,
        make,
    ) as watch:
        probes[0].silent = 4.9
        assert watch.check(None) is None and reports == []
        probes[0].silent = 6.0
        assert watch.check("generation 3 was published") == "generation 3 was published"
        probes[0].silent = 9.0
        watch.check(None)
    assert reports == [(0, 6.0, "store")] and probes[0].stopped


def test_nothing_is_probed_from_rank_0s_own_pod_or_without_a_reporter() -> None:
    made: list[tuple[str, int]] = []

    def make(address: tuple[str, int]) -> _Probe:
        made.append(address)
        return _Probe()

    with FormationWatch(_placement(0), lambda r, s: None, 5.0, make) as watch:
        assert watch.check("x") == "x"
    with FormationWatch(_placement(1), None, 5.0, make):
        pass
    with FormationWatch(_placement(1), lambda r, s: None, 0.0, make):
        pass  # the watchdog turned off (TORCHJOB_SILENT_PEER_S=0)
    assert made == []


# --- the members' hosts ----------------------------------------------------------------------


def test_a_sweep_asks_every_host_at_once_and_tells_the_silent_one_apart(
    silent_address: tuple[str, int],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        hosts = {
            1: srv.getsockname(),
            2: ("127.0.0.1", _closed_port()),
            3: silent_address,
            4: ("no-such-host.invalid", 29500),
        }
        answers = sweep(hosts, 0.5)
    assert answers == {1: True, 2: True, 3: False, 4: None}


def test_a_sweeps_connects_are_in_flight_together() -> None:
    """Not one after another: each connect here returns only once all three have started
    (a sequential sweep would break the barrier)."""
    together = threading.Barrier(3, timeout=30)

    def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
        together.wait()
        raise ConnectionRefusedError

    assert sweep({i: ("h", i) for i in range(3)}, 1.0, connect) == dict.fromkeys(range(3), True)


def test_the_hosts_probe_finds_only_the_silent_host(silent_address: tuple[str, int]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        probe = HostsProbe(
            {2: srv.getsockname(), 4: silent_address}, every_s=0.1, timeout_s=0.2
        ).start()
        try:
            deadline = time.monotonic() + 30
            while probe.silent().get(4, 0.0) < 0.5:
                assert time.monotonic() < deadline, "the probe never found host 4 silent"
                time.sleep(0.05)
            assert 2 not in probe.silent()
        finally:
            probe.stop()


class _Hosts:
    def __init__(self, peers: Mapping[int, tuple[str, int]]) -> None:
        self.peers = dict(peers)
        self.silences: dict[int, float] = {}
        self.stopped = False

    def silent(self) -> dict[int, float]:
        return dict(self.silences)

    def stop(self) -> None:
        self.stopped = True


def test_members_hosts_are_probed_once_the_formation_waited_and_each_silent_one_reported() -> None:
    """A sound formation is over within the threshold and probes no member; one still
    waiting probes them all, and reports each host silent past the threshold, once, as its
    pod's first rank (``host``)."""
    now = [0.0]
    made: list[_Hosts] = []
    reports: list[tuple[int, float, str]] = []
    peers = {2: ("job-worker-3.job.ns.svc", 29500), 3: ("job-worker-1.job.ns.svc", 29500)}

    def probe_hosts(p: Mapping[int, tuple[str, int]]) -> _Hosts:
        made.append(_Hosts(p))
        return made[-1]

    with FormationWatch(
        _placement(0),  # rank 0's own pod: no store to probe, its members still are
        lambda r, s, how: reports.append((r, s, how)),
        5.0,
        peers=peers,
        probe_hosts=probe_hosts,
        clock=lambda: now[0],
    ) as watch:
        now[0] = 4.9
        assert watch.check("x") == "x" and made == []
        now[0] = 5.0
        watch.check()
        assert [h.peers for h in made] == [peers]
        made[0].silences = {3: 4.0}
        watch.check()
        assert reports == []
        made[0].silences = {3: 5.5}
        watch.check()
        watch.check()
    assert reports == [(3, 5.5, "host")] and made[0].stopped and len(made) == 1


# --- members that never arrive ----------------------------------------------------------------


def _pods_of_two(rank_offset: int) -> Placement:
    """4 pods of 2 ranks each (8 ranks); this pod's first rank is ``rank_offset``."""
    return Placement(
        world_size=8,
        local_world_size=2,
        rank_offset=rank_offset,
        node_rank=rank_offset // 2,
        num_nodes=4,
        master_addr="job-worker-0.job",
        master_port=29500,
    )


def test_a_member_that_never_arrives_is_reported_once_after_the_bound_as_its_pods_first_rank() -> (
    None
):
    """bench/results/2026-12-01s notice120-0: two Ready joiners never entered the
    rendezvous and the survivors waited 108 s. The pod of ranks 6-7 (new in the generation)
    has one rank arrived, not the other: reported (``absent``) once the formation has waited
    the bound, once, as rank 6; nothing before the bound, nothing while the store cannot
    tell. The pod of ranks 4-5, a survivor still at its step, is never named."""
    now = [0.0]
    arrived: list[list[int] | None] = [[0, 1, 2, 3]]
    reads: list[float] = []
    reports: list[tuple[int, float, str]] = []

    def arrivals() -> list[int] | None:
        reads.append(now[0])
        return arrived[0]

    with FormationWatch(
        _pods_of_two(2),
        lambda r, s, how: reports.append((r, s, how)),
        5.0,
        lambda a: _Probe(),
        absence=Absence(arrivals, frozenset({6})),
        clock=lambda: now[0],
    ) as watch:
        now[0] = ABSENT_AFTER_S - 0.1
        assert watch.check("x") == "x" and reads == [] and reports == []
        arrived[0] = None  # rank 0's store did not answer
        now[0] = ABSENT_AFTER_S
        watch.check()
        assert reads == [ABSENT_AFTER_S] and reports == []
        arrived[0] = [0, 1, 2, 3, 6]
        now[0] = ABSENT_AFTER_S + 1.0
        watch.check()
        assert len(reads) == 1, "read again only every ARRIVALS_EVERY_S"
        now[0] = ABSENT_AFTER_S + 2.0
        watch.check()
        now[0] = ABSENT_AFTER_S + 4.0
        watch.check()
    assert reports == [(6, ABSENT_AFTER_S + 2.0, "absent")]


def test_a_pod_whose_own_ranks_have_not_arrived_names_nobody() -> None:
    now = [ABSENT_AFTER_S]
    reports: list[tuple[int, float, str]] = []
    with FormationWatch(
        _pods_of_two(4),  # ranks 4-5: rank 5 has not arrived
        lambda r, s, how: reports.append((r, s, how)),
        5.0,
        lambda a: _Probe(),
        absence=Absence(lambda: [0, 1, 2, 3, 4], frozenset({2, 6})),
        clock=lambda: now[0],
    ) as watch:
        watch.check()
    assert reports == []


def test_a_member_created_with_the_generation_is_named_only_after_the_start_timeout() -> None:
    """A newcomer the operator placed ahead (a Ready joiner) is named absent once the
    formation has waited ``ABSENT_AFTER_S``; one created with the generation must first start
    and import torch, and is named only after ``starting_after_s`` (the worker start timeout)."""
    now = [0.0]
    reports: list[tuple[int, float, str]] = []
    with FormationWatch(
        _pods_of_two(2),
        lambda r, s, how: reports.append((r, s, how)),
        5.0,
        lambda a: _Probe(),
        absence=Absence(lambda: [0, 1, 2, 3], frozenset({4, 6}), frozenset({6}), 120.0),
        clock=lambda: now[0],
    ) as watch:
        for t in (ABSENT_AFTER_S, 60.0, 117.0):
            now[0] = t
            watch.check()
        assert reports == [(4, ABSENT_AFTER_S, "absent")], "the placed newcomer, at 30 s"
        now[0] = 120.0
        watch.check()
    assert reports == [(4, ABSENT_AFTER_S, "absent"), (6, 120.0, "absent")]


def test_only_members_new_in_the_generation_may_be_named_absent() -> None:
    """``status.history``'s record of the generation says which pods joined in it; their
    first ranks are the only ones a formation names. Generation 0 has none (its pods start as
    their images come), and a pod that is the only newcomer names nobody."""
    pod = pod_env(job_name="tj", namespace="ns", pod_index=4, nproc_per_node=2)
    status = {
        "currentGeneration": 3,
        "replicas": 3,
        "members": [1, 4, 7],
        "history": [
            {"generation": 2, "began": "t", "cause": "Start", "joined": ["tj-worker-1@a"]},
            {"generation": 3, "began": "t", "cause": "ScaleUp", "joined": ["tj-worker-7@b"]},
        ],
    }
    m = Membership.from_status(status)
    assert m is not None and m.joined == ("tj-worker-7",)
    assert newcomer_ranks(pod, m) == {4}
    placement = _pods_of_two(2)
    absence = absence_of(pod, placement, m, 3)
    assert absence is not None and absence.newcomers == {4}
    assert absence.starting == set(), "tj-worker-7 was placed (@b) when it was published"
    made_with_it = {**status, "history": [{**status["history"][1], "joined": ["tj-worker-7"]}]}
    fresh = Membership.from_status(made_with_it)
    assert fresh is not None and fresh.joined == ("tj-worker-7",) and fresh.placed == ()
    starting = absence_of(pod, placement, fresh, 3)
    assert starting is not None and starting.starting == {4}
    assert starting.starting_after_s == max(
        ABSENT_AFTER_S, RuntimeSettings.from_env().start_timeout_s
    )
    assert absence_of(pod, placement, m, 2) is None, "another generation's membership"
    first = Membership.from_status({**status, "currentGeneration": 0})
    assert first is not None and first.joined == ()
    joiner = pod_env(job_name="tj", namespace="ns", pod_index=7, nproc_per_node=2)
    assert absence_of(joiner, _pods_of_two(4), m, 3) is None, "only itself is new"


def test_the_arrivals_are_read_where_the_workers_set_them() -> None:
    """``arrivals_reader`` reads the keys the workers set through their prefixed store
    (``StoreLayout.arrival_key``), in a real TCPStore; a store that is not there reads None."""
    dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=5), wait_for_workers=False)
    placement = Placement(
        world_size=4,
        local_world_size=1,
        rank_offset=1,
        node_rank=1,
        num_nodes=4,
        master_addr="127.0.0.1",
        master_port=server.port,
    )
    layout = StoreLayout("127.0.0.1", server.port, 7)
    for rank in (0, 2):  # what a worker does as it enters generation 7's rendezvous
        prefixed(layout.rendezvous, server).set(StoreLayout.arrival_key(rank), "1")
    prefixed(StoreLayout("127.0.0.1", server.port, 6).rendezvous, server).set(
        StoreLayout.arrival_key(3), "1"
    )  # another generation's arrival does not count
    assert arrivals_reader(placement, 7, use_libuv=True)() == [0, 2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = s.getsockname()[1]
    nobody = dataclasses.replace(placement, master_port=gone)
    assert arrivals_reader(nobody, 7, use_libuv=True)() is None


def test_peer_addresses_are_the_other_members_but_the_stores_host() -> None:
    pod = pod_env(job_name="tj", namespace="ns", pod_index=4, nproc_per_node=2)
    # pods 1, 4, 0, 7 in rank order: pod 1 serves the store, pod 4 is this one.
    assert peer_addresses(pod, (1, 4, 0, 7)) == {
        4: ("tj-worker-0.tj.ns.svc", pod.rdzv_port),
        6: ("tj-worker-7.tj.ns.svc", pod.rdzv_port),
    }


def test_a_sweep_stops_waiting_for_hosts_that_no_longer_matter() -> None:
    """``moot``: once every host that has not answered is one the caller no longer needs
    (a silent peer's node-mates declared by the watchdog meanwhile), the sweep returns
    without waiting out their connects: those read None (not asked), the others as
    answered."""
    release = threading.Event()
    pending_seen: list[frozenset[int]] = []

    def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
        if address[1] == 3:
            release.wait(timeout_s)  # a host that answers nothing until the test ends
            raise TimeoutError
        raise ConnectionRefusedError

    def moot(pending: frozenset[int]) -> bool:
        pending_seen.append(pending)
        return pending == frozenset({3})

    try:
        answers = sweep({i: ("h", i) for i in range(1, 4)}, 60.0, connect, moot=moot)
    finally:
        release.set()
    assert answers == {1: True, 2: True, 3: None}, answers
    assert pending_seen[-1] == frozenset({3})


def test_a_client_waits_for_its_server_to_listen_then_connects() -> None:
    """``await_listening`` tries again while the port refuses, and says True once a listener
    is there (TCPStore's own retries back off to seconds: bench/store_connect.py); at its
    deadline, with nothing listening, it says False."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    address = free.getsockname()
    free.close()
    assert not await_listening(address, 0.2)  # refused each time, until the deadline
    tries: list[tuple[str, int]] = []
    listening = threading.Event()
    srv = socket.socket()

    def connect(addr: tuple[str, int], timeout_s: float) -> socket.socket:
        tries.append(addr)
        if len(tries) == 3:  # the server comes up while the client waits
            srv.bind(addr)
            srv.listen()
            listening.set()
        return socket.create_connection(addr, timeout=timeout_s)

    try:
        assert await_listening(address, 30.0, connect, poll_s=0.01)
        assert listening.is_set() and len(tries) == 3, tries
    finally:
        srv.close()
