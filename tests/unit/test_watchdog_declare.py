"""The heartbeat watchdog's judgement (torchjob.launch.heartbeat.Watchdog), its store left
out: the judge loop alone, over beats set by hand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tests.kube import wait_for

from torchjob.launch.heartbeat import Watchdog, quiet_after
from torchjob.launch.layout import StoreLayout


def judge(
    silent_after: float,
    quiet: dict[int, float],
    *,
    local: range = range(0, 1),
    beating: tuple[int, ...] = (),
) -> tuple[Watchdog, list[int], list[int], Callable[[], None]]:
    """Rank 0's watchdog with its judge loop running: ``quiet`` maps the other ranks to how
    long they have been silent; ``beating`` ranks keep beating. Returns the watchdog, the
    ranks reported, the number reported at each break of the group, and a stop."""
    reported: list[int] = []
    breaks: list[int] = []
    live = threading.Event()
    dog: Watchdog

    def break_group() -> None:
        breaks.append(len(reported))
        dog.stop()  # what the worker does once its collective fails

    dog = Watchdog(
        rank=0,
        world_size=len(quiet) + 1,
        local_ranks=local,
        on_silent=lambda rank, _s: reported.append(rank),
        silent_after=silent_after,
        break_group=break_group,
        layout=StoreLayout(addr="127.0.0.1", port=1, generation=0),
    )
    now = time.monotonic()
    dog._store_ok = now + 1000  # the store answers (its beat loop is not run here)
    dog._last_seen = {r: now - s for r, s in quiet.items()}

    def beat() -> None:
        while not live.wait(0.2):
            with dog._lock:
                for r in beating:
                    dog._last_seen[r] = time.monotonic()

    threading.Thread(target=beat, daemon=True).start()
    dog._threads[1].start()  # the judge loop only

    def stop() -> None:
        live.set()
        dog.stop()

    return dog, reported, breaks, stop


def test_every_rank_of_a_vanished_node_is_reported_before_the_group_breaks() -> None:
    """A node that vanishes silences all its ranks at once. Breaking the group ends this
    watchdog's generation (the training thread stops it), so a rank judged after the break
    was never reported: seen in the fleet benchmark, one of a vanished node's 4 pods
    reported and the other 3 kept as members of the next generation."""
    _, reported, breaks, stop = judge(0.5, {1: -1000, 2: 10, 3: 10, 4: 10})
    try:
        wait_for(lambda: breaks, 10, "the group broken")
    finally:
        stop()
    assert sorted(reported) == [2, 3, 4] and breaks == [3], (reported, breaks)


def test_ranks_about_to_be_silent_go_with_the_first_one_and_live_ranks_stay() -> None:
    """The ranks of a vanished node cross the threshold up to a beat apart: the first one's
    declaration ends the generation, so those quiet for more than half the threshold go with
    it (seen: 1 of a node's 4 pods in one generation, the other 3 in the next, 24 s later).
    A rank that beats stays."""
    _, reported, breaks, stop = judge(6.0, {1: 0, 2: 10, 3: 4.5, 4: 0}, beating=(1, 4))
    try:
        wait_for(lambda: breaks, 20, "the group broken")
    finally:
        stop()
    assert sorted(reported) == [2, 3] and breaks == [2], (reported, breaks)


def test_a_silent_rank_of_this_host_is_reported_without_breaking_the_group() -> None:
    """The driver kills a silent local rank itself; the group is not broken for it."""
    _, reported, breaks, stop = judge(0.5, {1: 10}, local=range(0, 2))
    try:
        wait_for(lambda: reported, 10, "rank 1 reported")
    finally:
        stop()
    assert reported == [1] and breaks == []


def test_a_quiet_store_is_said_once_ahead_of_rank_0_found_silent() -> None:
    """Rank 2's watchdog: the store stops answering (rank 0's pod frozen). At ``quiet_after``
    (3 s of 5; here 1.2 of 2, scaled) the watchdog says so once, so that the driver's sweep of
    the members' hosts runs while the threshold runs out; rank 0 is declared at the
    threshold, after the quiet word."""
    said: list[tuple[str, float]] = []
    breaks: list[int] = []
    dog = Watchdog(
        rank=2,
        world_size=4,
        local_ranks=range(2, 3),
        on_silent=lambda rank, s: said.append((f"silent {rank}", s)),
        on_quiet=lambda s: said.append(("quiet", s)),
        silent_after=2.0,
        break_group=lambda: (breaks.append(1), dog.stop()),
        interval_s=0.1,
        layout=StoreLayout(addr="127.0.0.1", port=1, generation=0),
    )
    assert quiet_after(5.0) == 3.0 and quiet_after(2.0) == 1.0 and quiet_after(1.0) == 0.5
    now = time.monotonic()
    dog._store_ok = now  # the store's last answer; its beat loop is not run here
    dog._last_seen = dict.fromkeys(dog._last_seen, now + 1000)
    dog._threads[1].start()  # the judge loop only
    try:
        wait_for(lambda: breaks, 10, "rank 0 declared")
    finally:
        dog.stop()
    assert [w for w, _ in said] == ["quiet", "silent 0"], said
    assert 1.0 < said[0][1] <= 2.0 < said[1][1], said
