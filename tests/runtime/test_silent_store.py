"""A silent rank 0: the store that every beat goes through goes silent with it (issue 39).

A real ``TCPStore`` served by another process, frozen with SIGSTOP (no FIN, no RST: a node
that vanished, as its peers see it). A ``TCPStore`` client's ``check`` to such a server
blocks for ever whatever its timeout, so the watchdog that asked the store and judged the
answer on one thread never judged again: rank 0 was never declared, and the survivors waited
out the collective timeout (300 s). The watchdog now judges on a thread that never touches
the store. When it declares a peer of another host silent it breaks the group's own
connections only: a connection of the user's (an object store, MLflow, a database) stays up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist
from tests.kube import wait_for

from torchjob.launch import heartbeat, store_clients
from torchjob.launch.driver_beat import process_runs
from torchjob.launch.layout import StoreLayout

SILENT_S = 2.0

SERVE = """
import sys, time
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
print(s.port, flush=True)
while True:
    time.sleep(1)
"""


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until the kernel shows it stopped: ``kill`` returns before
    every thread has stopped, and on a loaded machine a request sent at once was answered
    (a CI run: "DID NOT RAISE TimeoutError")."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:  # every thread: the store's server is a thread of its own
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        return not any(process_runs(t) for t in tasks)

    wait_for(stopped, 30, f"every thread of process {pid} stopped", interval=0.01)


@pytest.fixture
def store_server() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A TCPStore served by a process of its own (rank 0's pod), and its port."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    yield proc, port
    proc.kill()
    proc.wait()


class Connected:
    """A listening socket and one established connection to it, both ends held."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.client = socket.create_connection(self.server.getsockname())
        self.peer, _ = self.server.accept()

    def answers(self) -> bool:
        self.client.sendall(b"ping")
        self.peer.settimeout(5)
        return self.peer.recv(4) == b"ping"

    def close(self) -> None:
        for s in (self.client, self.peer, self.server):
            s.close()


def test_a_frozen_store_is_rank_0_gone_silent_and_only_the_groups_connections_break(
    store_server: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, port = store_server
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    user = Connected()  # opened before the group: the user's own connection
    before = heartbeat.socket_inodes()
    group = Connected()  # stands for gloo's pairs, opened while the group forms
    group_sockets = heartbeat.socket_inodes() - before
    layout = StoreLayout(addr="127.0.0.1", port=port, generation=0)
    declared: list[tuple[int, float]] = []
    dog = heartbeat.Watchdog(
        rank=1,
        world_size=2,
        local_ranks=range(1, 2),
        on_silent=lambda rank, s: declared.append((rank, s)),
        silent_after=SILENT_S,
        break_group=lambda: heartbeat.break_group_connections(group_sockets),
        layout=layout,
    ).start()
    try:
        # Rank 0 beats too, so that rank 1 sees a live peer before the freeze.
        rank0 = dist.PrefixStore(  # type: ignore[attr-defined]
            layout.heartbeat,
            dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10)),  # type: ignore[attr-defined]
        )
        stop_beating = threading.Event()

        def beat0() -> None:
            n = 0
            while not stop_beating.wait(0.2):
                n += 1
                rank0.set("0", str(n))

        threading.Thread(target=beat0, daemon=True).start()
        wait_for(lambda: dog._last_value.get(0) is not None, 30, "rank 0's beat seen by rank 1")
        assert not declared
        stop_beating.set()
        freeze(proc.pid)
        wait_for(lambda: declared, 60, "rank 0 declared silent (its store frozen)")
        assert [r for r, _ in declared] == [0]
        assert declared[0][1] > SILENT_S
        # The group's connection was shut down: its peer reads the end of the stream.
        group.peer.settimeout(5)
        assert group.peer.recv(4) == b""
        assert user.answers(), "the user's connection must survive a silent peer"
    finally:
        dog.stop()
        user.close()
        group.close()


def test_a_kept_connection_to_a_frozen_store_is_replaced_not_waited_on(
    store_server: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = store_server
    timeout = timedelta(seconds=SILENT_S)
    kept = store_clients.client("probe-test", "127.0.0.1", port, connect=timeout, timeout=timeout)
    try:
        freeze(proc.pid)
        with pytest.raises(TimeoutError):
            store_clients.within(1.0, lambda: kept.check(["some-key"]))
        # The probe of the kept connection must not block: it gives up and connects anew,
        # which fails while the server is frozen (its listening socket accepts, the
        # handshake is never answered), instead of hanging.
        failed = threading.Event()

        def reuse() -> None:
            try:
                store_clients.client(
                    "probe-test",
                    "127.0.0.1",
                    port,
                    connect=timedelta(seconds=1),
                    timeout=timeout,
                )
            except Exception:
                failed.set()

        t = threading.Thread(target=reuse, daemon=True)
        t.start()
        wait_for(failed.is_set, 60, "the kept connection's probe gave up on the frozen store")
    finally:
        store_clients.discard("probe-test", "127.0.0.1", port)
