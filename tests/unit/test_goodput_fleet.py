"""bench/goodput_fleet.py: a fleet that provisions a spare node for each noticed one (issue 39's
notice rows, Karpenter's interruption handling), and what the profile counts as no free node."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from bench import goodput_fleet as gf
from bench import goodput_phases as ph


def test_spares_keep_the_tainted_nodes_then_take_the_last_by_name() -> None:
    spot = ["n1", "n2", "n3", "n4", "n5", "n6"]
    assert gf.choose_spares(spot, [], 3) == ["n4", "n5", "n6"]
    assert gf.choose_spares(spot, ["n1", "n3"], 3) == ["n1", "n3", "n6"]
    assert gf.choose_spares(spot, ["n1", "n2", "n3", "n4"], 2) == ["n1", "n2"]
    assert gf.choose_spares(spot, ["n2"], 0) == []


def test_spares_leave_a_node_to_train_on() -> None:
    with pytest.raises(ValueError, match="--spares 3: needs at least one spot node"):
        gf.choose_spares(["a", "b", "c"], [], 3)


class _Core:
    """Nodes with taints and a Ready condition; patches recorded."""

    def __init__(self, ready: dict[str, bool], tainted: set[str]) -> None:
        self.ready = ready
        self.taints = {n: [{"key": gf.SPARE_TAINT}] if n in tainted else [] for n in ready}

    def _node(self, name: str) -> Any:
        taints = [SimpleNamespace(key=t["key"]) for t in self.taints[name]]
        ready = SimpleNamespace(type="Ready", status="True" if self.ready[name] else "Unknown")
        return SimpleNamespace(
            metadata=SimpleNamespace(name=name),
            spec=SimpleNamespace(taints=taints),
            status=SimpleNamespace(conditions=[ready]),
        )

    def read_node(self, name: str) -> Any:
        return self._node(name)

    def list_node(self) -> Any:
        return SimpleNamespace(items=[self._node(n) for n in sorted(self.ready)])

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self.taints[name] = [dict(t) for t in body["spec"]["taints"]]

    def spares(self) -> set[str]:
        return {n for n, ts in self.taints.items() if any(t["key"] == gf.SPARE_TAINT for t in ts)}


def test_a_row_taints_its_spares_and_untaints_the_others() -> None:
    core = _Core(dict.fromkeys(["a", "b", "c", "d", "e"], True), tainted={"a"})
    notes: list[tuple[str, dict[str, Any]]] = []
    gf.Fleet.for_row(core, ["a", "b", "c", "d", "e"], 2, 0.0, lambda w, **f: notes.append((w, f)))
    assert core.spares() == {"a", "e"}
    assert notes == [("fleet", {"live": ["b", "c", "d"], "spares": ["a", "e"]})]


def test_each_notice_untaints_one_ready_spare_never_one_still_away() -> None:
    core = _Core({"a": True, "b": True, "s1": False, "s2": True}, tainted={"s1", "s2"})
    notes: list[tuple[str, dict[str, Any]]] = []
    fleet = gf.Fleet(core, 0.0, lambda w, **f: notes.append((w, f)))
    stop = threading.Event()
    fleet.provision_after("a", stop).join(5)
    assert core.spares() == {"s1"}  # s1 is not Ready: s2 went
    assert notes[0][0] == "provisioned" and notes[0][1]["node"] == "s2"
    assert notes[0][1]["replaces"] == "a"
    # The noticed node comes back as a spare; until it is back, it is no one's.
    fleet.retire("a")
    assert core.spares() == {"s1", "a"}
    waiting = fleet.provision_after("b", stop)
    waiting.join(1.5)
    assert waiting.is_alive() and core.spares() == {"s1", "a"}  # a is away, s1 not Ready
    fleet.back("a")
    waiting.join(5)
    assert not waiting.is_alive() and core.spares() == {"s1"}
    assert notes[-1][1]["node"] == "a" and notes[-1][1]["waited"] > 0


def test_a_stopped_row_provisions_nothing() -> None:
    core = _Core({"a": True, "s": True}, tainted={"s"})
    stop = threading.Event()
    stop.set()
    gf.Fleet(core, 0.0).provision_after("a", stop).join(5)
    assert core.spares() == {"s"}


def test_with_spares_a_provisioned_node_is_free_and_a_returned_spare_is_not() -> None:
    trace: list[dict[str, Any]] = [
        {"t": 0.0, "what": "fleet", "live": ["a", "b"], "spares": ["s"]},
        {"t": 0.0, "what": "window", "t0": 0.0, "t1": 200.0},
        {"t": 10.0, "what": "notice120", "node": "a"},
        {"t": 20.0, "what": "notice120", "node": "b"},  # none free from 20 s ...
        {"t": 70.0, "what": "provisioned", "node": "s"},  # ... to 70 s: 50 s
        {"t": 160.0, "what": "returned", "node": "a", "spare": True},  # a spare: frees nothing
        {"t": 170.0, "what": "notice120", "node": "s"},  # none free from 170 s to the end
    ]
    assert ph.no_free_node(trace) == (
        "no spot node free (2 in use, 1 spares): 80.0s of the 200.0s window (0.400)"
    )
