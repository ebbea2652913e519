"""bench/goodput_losses.py and bench/_goodput_state.py: which node a node loss takes, what it
records, and the workers' state size (issue 39)."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from bench import _goodput_state as state
from bench import goodput_losses as gl
from tests import kube as k


def _pod(name: str, node: str, phase: str = "Running", deleting: bool = False) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(
            name=name,
            uid=f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",  # no process's
            deletion_timestamp="now" if deleting else None,
        ),
        spec=SimpleNamespace(node_name=node),
        status=SimpleNamespace(phase=phase),
    )


class _Core:
    def __init__(self, pods: dict[str, list[Any]]) -> None:
        self.pods = pods

    def list_namespaced_pod(self, ns: str) -> Any:
        return SimpleNamespace(items=self.pods.get(ns, []))


class _Nodes:
    """RealNode's node faults, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def vanish(self, node: str) -> None:
        self.calls.append(("vanish", node))

    def reclaim(self, node: str) -> None:
        self.calls.append(("reclaim", node))

    def return_node(self, node: str, wait: bool = True) -> None:
        self.calls.append(("return", node, str(wait)))


def _cluster() -> _Core:
    job = [
        _pod("w0", "real-0"),  # beside the operator
        _pod("w1", "real-1"),
        _pod("w2", "real-1"),
        _pod("w3", "real-1", phase="Pending"),  # on the node, not yet running: lost too
        _pod("w4", "real-1", deleting=True),  # already going
        _pod("w5", "real-2", phase="Pending"),  # no running pod of the job: not eligible
    ]
    return _Core({"job": job, gl.OPERATOR_NS: [_pod("operator", "real-0")], "kube-system": []})


class _Watch:
    def __init__(self) -> None:
        self.notes: list[tuple[str, dict[str, Any]]] = []

    def note(self, what: str, **fields: Any) -> None:
        self.notes.append((what, fields))

    def keep_logs_before_vanish(self, pods: list[Any]) -> None:
        self.notes.append(("logs", {"pods": [p.metadata.name for p in pods]}))


def test_a_vanish_takes_a_node_with_a_running_pod_away_from_the_operator() -> None:
    core, nodes, watch = _cluster(), _Nodes(), _Watch()
    losses = gl.Losses(core, "job", "vanish", random.Random(0), nodes, 0.0, watch)
    assert gl.infra_nodes(core) == {"real-0"}
    rec = losses.take(gen_before=3, step_before=120)
    assert rec is not None
    assert (rec.node, rec.pods, rec.gen_before, rec.step_before) == (
        "real-1",
        ["w1", "w2", "w3"],
        3,
        120,
    )
    assert losses.join(timeout=10.0) == []  # node_return 0: back at once, in the background
    # Gone, the node's pods give their memory back at once (reclaim), long before the node
    # returns; whatever that left is killed before the return (none on this host here).
    assert nodes.calls == [
        ("vanish", "real-1"),
        ("reclaim", "real-1"),
        ("return", "real-1", "False"),
    ]
    # The lost pods' logs are read while their kubelet answers, before the loss is noted.
    assert [w for w, _ in watch.notes] == ["logs", "vanish", "gone", "reclaimed", "returned"]
    assert watch.notes[0][1] == {"pods": ["w1", "w2", "w3"]}
    assert watch.notes[1][1] == {"node": "real-1", "pods": ["w1", "w2", "w3"]}
    assert watch.notes[4][1] == {"node": "real-1", "killed": 0}


class _NoReclaim(_Nodes):
    def reclaim(self, node: str) -> None:
        raise RuntimeError("hack/node.sh reclaim failed")


def test_a_reclaim_that_fails_still_returns_the_node_and_thaw_keeps_its_pods() -> None:
    """A reclaim that fails is logged and the node still comes back (its pods' processes
    killed then, as before reclaim); ``--thaw`` (the same VM resuming) reclaims nothing."""
    core, nodes, watch = _cluster(), _NoReclaim(), _Watch()
    losses = gl.Losses(core, "job", "vanish", random.Random(0), nodes, 0.0, watch)
    assert losses.take(gen_before=0, step_before=0) is not None
    assert losses.join(timeout=10.0) == []
    assert nodes.calls == [("vanish", "real-1"), ("return", "real-1", "False")]
    assert [w for w, _ in watch.notes] == ["logs", "vanish", "gone", "returned"]
    core, nodes, watch = _cluster(), _Nodes(), _Watch()
    thawed = gl.Losses(core, "job", "vanish", random.Random(0), nodes, 0.0, watch, thaw=True)
    assert thawed.take(gen_before=0, step_before=0) is not None
    assert thawed.join(timeout=10.0) == []
    assert nodes.calls == [("vanish", "real-1"), ("return", "real-1", "False")]


def test_a_node_already_gone_is_not_taken_again_and_nothing_left_is_a_skip() -> None:
    core, nodes = _cluster(), _Nodes()
    losses = gl.Losses(core, "job", "vanish", random.Random(0), nodes, node_return=0.0)
    losses.gone.add("real-1")  # still away from an earlier loss
    assert losses.take(0, 0) is None
    assert nodes.calls == []


def test_a_loss_with_nothing_to_take_is_held_until_a_node_qualifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The only eligible node is still away; it returns during the hold: the loss takes it
    then and says how long it was held. With nothing back within the hold, it is skipped."""
    monkeypatch.setattr(gl, "HOLD_POLL_S", 0.01)
    core, nodes = _cluster(), _Nodes()
    losses = gl.Losses(core, "job", "vanish", random.Random(0), nodes, node_return=0.0)
    losses.gone.add("real-1")
    assert losses.take_held(lambda: (0, 0), hold_s=0.05) is None
    assert nodes.calls == []
    looks = []

    def where() -> tuple[int, int]:
        looks.append(len(looks))
        if len(looks) == 3:
            losses.gone.discard("real-1")  # back: this look finds it
        return (2, 40)

    rec = losses.take_held(where, hold_s=60.0)
    assert rec is not None and (rec.node, rec.gen_before, rec.step_before) == ("real-1", 2, 40)
    assert len(looks) == 3 and rec.held > 0.0
    assert nodes.calls[0] == ("vanish", "real-1")
    losses.join(timeout=10.0)


def test_pod_modes_skip_when_no_pod_runs() -> None:
    losses = gl.Losses(_Core({"job": [_pod("w0", "real-1", phase="Pending")]}), "job", "hard",
                       random.Random(0))  # fmt: skip
    assert losses.take(0, 0) is None


def test_a_node_loss_needs_the_real_nodes() -> None:
    losses = gl.Losses(_cluster(), "job", "notice30", random.Random(0))
    with pytest.raises(RuntimeError, match="needs the real nodes"):
        losses.take(0, 0)


def test_a_noticed_node_has_its_pods_logs_read_before_it_goes() -> None:
    """A notice's node goes ``noticeN`` s later, with the pods still on it then: their logs
    are read just before (here at once: ``after_s`` 0), from a thread."""
    watch = _Watch()
    losses = gl.Losses(_cluster(), "job", "notice30", random.Random(0), _Nodes(), 0.0, watch)
    losses._logs_before_vanish("real-1", 0.0)
    k.wait_for(lambda: watch.notes, 10, "the logs read", interval=0.01)
    assert watch.notes == [("logs", {"pods": ["w1", "w2", "w3"]})]


class _NoticingNodes(_Nodes):
    def notice(self, node: str, **kw: Any) -> Any:
        self.calls.append(("notice", node))
        return SimpleNamespace(communicate=lambda: ("tainted, drained, gone", None))


class _Fleet:
    """goodput_fleet.Fleet's calls, recorded (its own test: test_goodput_fleet.py)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def provision_after(self, lost: str, stop: threading.Event) -> threading.Thread:
        self.calls.append(("provision", lost))
        thread = threading.Thread(target=lambda: None)
        thread.start()
        return thread

    def retire(self, node: str) -> None:
        self.calls.append(("retire", node))

    def back(self, node: str) -> None:
        self.calls.append(("back", node))


@pytest.mark.parametrize(("mode", "spare"), [("notice30", True), ("vanish", False)])
def test_with_spares_a_notice_provisions_one_and_its_node_returns_as_one(
    mode: str, spare: bool
) -> None:
    nodes, fleet, watch = _NoticingNodes(), _Fleet(), _Watch()
    losses = gl.Losses(_cluster(), "job", mode, random.Random(0), nodes, 0.0, watch, fleet=fleet)  # type: ignore[arg-type]
    assert losses.take(gen_before=1, step_before=10) is not None
    assert losses.join(timeout=10.0) == []
    if spare:  # the replacement launched on the notice; the node back as a spare
        assert fleet.calls == [("provision", "real-1"), ("retire", "real-1"), ("back", "real-1")]
        assert ("returned", {"node": "real-1", "killed": 0, "spare": True}) in watch.notes
    else:  # a vanish row keeps its spares idle: the node comes back itself
        assert fleet.calls == []
        assert ("returned", {"node": "real-1", "killed": 0}) in watch.notes
    assert nodes.calls[-1] == ("return", "real-1", "False")


def test_state_is_sized_to_the_stated_mib() -> None:
    for mib in (64, 256, 1024):
        layers = state.layers_for(mib)
        # parameters + Adam's two moments, float32
        assert 3 * layers * state.LAYER_MIB == pytest.approx(mib, rel=0.1)
    assert state.layers_for(1) == 1
    assert state.state_mib(["w.py", "ev", "--state-mib", "64"]) == 64
    assert state.state_mib(["w.py", "ev", "--restore-point"]) == 0


def test_the_default_state_is_the_tiny_model_and_a_sized_one_is_touched_whole() -> None:
    import torch

    model, x = state.build(0, 32)
    assert isinstance(model, torch.nn.Linear) and tuple(x.shape) == (32, 16)
    assert isinstance(state.optimizer(0, model.parameters()), torch.optim.SGD)
    model, x = state.build(12, 32)  # 1 layer
    opt = state.optimizer(12, model.parameters())
    assert isinstance(opt, torch.optim.Adam)
    model(x).pow(2).mean().backward()
    opt.step()
    params = list(model.parameters())
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params)
    assert sum(len(opt.state[p]) for p in params) == 3 * len(params)  # step, exp_avg, exp_avg_sq
