"""Nodes whose kubelet stopped renewing its Lease get no new pod (``common.nodes.quiet``,
``engine.nodewatch.NodeBook``), 20 s or more before the node controller marks them
``Ready=Unknown``."""

from __future__ import annotations

from dataclasses import replace

from tests.unit.builders import at, job
from tests.unit.test_place_again import kept_off
from tests.unit.test_planner import step

from torchjob_operator.common.nodes import (
    AVOIDED_NODES,
    DEFAULT_NOTICE_TAINTS,
    LEASE_QUIET_S,
    LeaseRead,
    NodeView,
    Renewal,
    node_view,
    quiet,
    renewal,
    why_avoided,
)
from torchjob_operator.engine.nodewatch import NodeBook, lease_read
from torchjob_operator.torchjob.plan import plan
from torchjob_operator.torchjob.writes import decide, kept_off_nodes


def stamp(seconds: float, duration_s: float | None = 40.0) -> LeaseRead:
    """A node's Lease as a kubelet writes it at ``seconds``: its ``spec.renewTime`` and
    ``leaseDurationSeconds`` (40 s by default: renewed every 10 s)."""
    return LeaseRead(
        at(seconds).isoformat(timespec="microseconds").replace("+00:00", "Z"), duration_s
    )


def test_a_lease_counts_as_renewed_when_it_changes_and_only_then() -> None:
    first = renewal(None, stamp(0), at(3))
    assert first == Renewal(stamp(0).renew_time, at(3)) and not first.renewing, "read once"
    assert renewal(first, stamp(0), at(30)) is first, "the same renewTime read again"
    again = renewal(first, stamp(10), at(11))
    assert again == Renewal(stamp(10).renew_time, at(11), renewing=True)
    assert not again.quiet_at(at(11 + LEASE_QUIET_S)) and again.quiet_at(at(12 + LEASE_QUIET_S))


def test_a_lease_is_quiet_after_half_its_duration() -> None:
    """The kubelet renews every quarter of ``leaseDurationSeconds`` (40 s by default): two
    renewals missed is half of it, whatever the cluster set."""
    long = renewal(renewal(None, stamp(0, 120.0), at(0)), stamp(30, 120.0), at(30))
    assert long.quiet_s == 60.0
    assert not long.quiet_at(at(30 + 59)) and long.quiet_at(at(30 + 61))
    short = renewal(renewal(None, stamp(0, 10.0), at(0)), stamp(3, 10.0), at(3))
    assert short.quiet_at(at(3 + 6))
    unsaid = renewal(renewal(None, stamp(0, None), at(0)), stamp(10, None), at(10))
    assert unsaid.quiet_s == LEASE_QUIET_S
    raw = {"metadata": {"name": "n1"}, "spec": {"renewTime": "t", "leaseDurationSeconds": 40}}
    assert lease_read(raw) == LeaseRead("t", 40.0)
    assert lease_read({"spec": {}}) == LeaseRead("", None)


def test_a_node_not_renewing_while_others_do_is_quiet() -> None:
    live = Renewal(stamp(40).renew_time, at(40), renewing=True)
    stopped = Renewal(stamp(10).renew_time, at(10), renewing=True)
    never = Renewal(stamp(0).renew_time, at(0))  # a Lease never seen renewed is not judged
    assert quiet({"a": live, "b": stopped, "k": never}, at(45)) == ("b",)
    assert quiet({"a": live, "b": stopped}, at(30)) == (), "not yet 20 s"
    # Nothing renewed for 20 s anywhere: the watch or the API server stalls, not every node;
    # nor is it the nodes when more are quiet than not.
    assert quiet({"a": live, "b": stopped}, at(61)) == ()
    assert quiet({"a": live, "b": stopped, "c": stopped}, at(45)) == ()
    assert quiet({"a": live, "b": stopped, "c": stopped, "d": live}, at(45)) == ("b", "c")
    assert quiet({}, at(61)) == ()


def test_the_book_keeps_quiet_nodes_off_and_says_when_one_renews_again() -> None:
    book = NodeBook()
    book.replace({n: NodeView(n) for n in ("a", "b", "c")}, now=at(0))
    assert book.renewals_listed({"a": stamp(0), "b": stamp(0), "c": stamp(0)}, at(0)) == set()
    for t in (10, 20, 30):  # a and b renew every 10 s; b stops after 10 s
        assert book.renewed({"a": stamp(t), **({"b": stamp(t)} if t == 10 else {})}, at(t)) == set()
    assert book.avoid(at(30)) == ()
    assert book.avoid(at(31)) == ("b",), "b quiet for 21 s; c never seen renewed: not judged"
    assert book.put(NodeView("c", ready=False))
    assert book.avoid(at(31)) == ("b", "c"), "with the nodes that are not Ready"
    assert book.renewed({"b": stamp(35)}, at(36)) == {"b"}, "quiet, and renewed: poke"
    assert book.avoid(at(36)) == ("c",)
    assert book.renewed({"b": stamp(45)}, at(46)) == set(), "renewed in time: nothing"
    book.lease_gone("b")
    assert book.renewals_listed({"a": stamp(50)}, at(50)) == set()
    assert book.avoid(at(90)) == ("c",), "a forgotten Lease is not judged"


REAL = tuple(f"tj-goodput-real-{i}" for i in range(4))


def test_a_restart_goes_nowhere_near_a_node_back_within_the_grace_but_not_renewing() -> None:
    """Issue 39, bench/results/2026-12-05v repeat 2 (30 s notices; times from 23:56:40):
    real-3 vanished at 34.7 s (its last renewal 30 s), came back at 66 s without renewing;
    real-1 vanished at 45 s (last renewal 40 s), came back at 75 s and renewed at 77 s;
    real-2 was noticed. At 71 s generation 12's eight pods were created: the spread put them
    all on real-3, shown Ready and empty; the node controller marked it lost at 80 s, and
    the pods were made again (NodeLost, generation 13), 55 s without a step. Kept off the
    quiet nodes, the pods wait for one that renews, and are made again there at once."""
    book = NodeBook()
    book.replace({n: NodeView(n) for n in REAL}, now=at(0))
    book.renewals_listed({n: stamp(0) for n in REAL}, at(0))
    last = {REAL[0]: 70, REAL[1]: 40, REAL[2]: 70, REAL[3]: 30}
    for t in range(10, 71, 10):
        book.renewed({n: stamp(t) for n, stop in last.items() if t <= stop}, at(t))
    gke = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    noticed = {"metadata": {"name": REAL[2]}, "spec": {"taints": [gke]}, "status": {}}
    assert book.put(node_view(noticed, DEFAULT_NOTICE_TAINTS), now=at(44))
    avoid = book.avoid(at(71))
    assert avoid == REAL[1:], "real-1 and real-3 quiet, real-2 noticed"
    view = replace(job().replicas(8).build(), avoid_nodes=avoid, nodes=book.snapshot())
    made = decide(view, "uid", [], (), at(71))
    assert made.plan.create is not None and len(made.workers) == 8
    told = [e for e in made.events if e.reason == "KeptOffNodes"]
    assert len(told) == 1, made.events
    lease, notice = "its kubelet's Lease not renewed", f"termination notice {gke['key']}"
    assert f"{REAL[1]} ({lease}), {REAL[2]} ({notice}), {REAL[3]} ({lease})" in told[0].message
    assert all(body["metadata"]["name"] in told[0].message for body in made.workers)
    for body in made.workers:
        terms = body["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        kept = {f["values"][0] for t in terms for f in t["matchFields"]}
        assert kept == set(REAL[1:]), kept
        assert body["metadata"]["annotations"][AVOIDED_NODES] == ",".join(REAL[1:])
    # real-1 renews: the jobs kept off it are poked, and its pods that found no node are
    # made again, now free to go there (the same generation: nothing counted).
    assert book.renewed({REAL[1]: stamp(77), REAL[0]: stamp(77)}, at(77)) == {REAL[1]}
    _, view, pods = step(view, [], 71)
    pending = [kept_off(p, REAL[1:], since_s=72) for p in pods]
    again = plan(replace(view, avoid_nodes=book.avoid(at(78))), pending, at(78))
    assert set(again.delete) == {p.name for p in pods}
    assert again.status["disruptions"] == 0 and again.status["restarts"] == 0
    said = next(e for e in again.events if e.reason == "PlacingAgain")
    assert f"kept off {REAL[1]}," in said.message, said.message


def test_why_a_node_is_avoided_names_a_lost_node_before_its_notice() -> None:
    gone = NodeView("a", ready=False, notice="karpenter.sh/disrupted")
    noticed = NodeView("b", notice="karpenter.sh/disrupted")
    said = why_avoided(("a", "b", "c"), {"a": gone, "b": noticed, "c": NodeView("c")})
    assert said == (
        "a (not Ready), b (termination notice karpenter.sh/disrupted), "
        "c (its kubelet's Lease not renewed)"
    )


def test_no_event_when_nothing_is_avoided_or_nothing_is_made() -> None:
    view = job().replicas(2).build()
    assert not [e for e in decide(view, "uid", [], (), at(0)).events if e.reason == "KeptOffNodes"]
    kept = replace(view, avoid_nodes=("a",))
    assert kept_off_nodes(kept, []) == ()
