"""A pod's role in a generation, as data (``torchjob.contract``): a member with its rank among
the generation's pods, or a standby. Every branch: by the job's published status (members in
rank order, or the default ``0..replicas-1``), and by the pod's env while the status says
nothing of its own (not yet published, or the very generation the env was written for)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.unit.builders import pod_env as pod

from torchjob import contract
from torchjob.contract import Member, PodEnv, Standby, pod_as_of, pod_role, ranked, role_in
from torchjob.launch import Placement
from torchjob.launch.policy import RunState
from torchjob.train.controller import Controller
from torchjob.train.modes import KeepSurvivorsMode
from torchjob.train.progress import ProgressView
from torchjob.train.recovery.membership import Membership

KEEP = contract.KEEP_SURVIVORS


@dataclass(frozen=True)
class Status:
    """A published generation, as any value with the three fields (``contract.Published``)."""

    generation: int
    replicas: int
    members: tuple[int, ...] | None = None


@pytest.mark.parametrize(
    ("members", "index", "role"),
    [
        pytest.param(None, 0, Member(3, 0, 3), id="default-order-rank-0"),
        pytest.param(None, 2, Member(3, 2, 3), id="default-order-last-rank"),
        pytest.param(None, 3, Standby(3), id="default-order-beyond-replicas"),
        pytest.param((2, 0, 1), 2, Member(3, 0, 3), id="members-first-is-rank-0"),
        pytest.param((2, 0, 1), 0, Member(3, 1, 3), id="members-middle"),
        pytest.param((2, 0, 1), 1, Member(3, 2, 3), id="members-last"),
        pytest.param((2, 0, 1), 4, Standby(3), id="members-standby-beyond"),
    ],
)
def test_role_in_a_published_generation(
    members: tuple[int, ...] | None, index: int, role: contract.Role
) -> None:
    assert role_in(Status(3, 3, members), index) == role


def test_a_pod_below_replicas_but_not_in_members_is_a_standby() -> None:
    """Pod 0 lost, survivors (1, 2) and a standby created at the freed index 0."""
    assert role_in(Status(4, 2, (1, 2)), 0) == Standby(4)
    assert role_in(Status(4, 2, (1, 2)), 1) == Member(4, 0, 2)


def test_ranked_is_members_or_the_default_order() -> None:
    assert ranked(Status(0, 3)) == (0, 1, 2)
    assert ranked(Status(0, 2, (1, 0))) == (1, 0)


def test_membership_is_a_published_generation() -> None:
    m = Membership.from_status({"currentGeneration": 2, "replicas": 2, "members": [1, 3]})
    assert m is not None
    assert (m.role(3), m.role(1), m.role(0)) == (Member(2, 1, 2), Member(2, 0, 2), Standby(2))
    assert pod_role(pod(pod_index=3, generation=1), m) == Member(2, 1, 2)


@pytest.mark.parametrize(
    ("env", "role"),
    [
        pytest.param({"pod_index": 0}, Member(0, 0, 2), id="env-rank-0"),
        pytest.param({"pod_index": 1}, Member(0, 1, 2), id="env-rank-1"),
        pytest.param({"pod_index": 0, "node_rank": 1}, Member(0, 1, 2), id="env-node-rank"),
        pytest.param({"pod_index": 2, "generation": 1}, Standby(1), id="env-standby-beyond"),
        pytest.param({"pod_index": 3, "node_rank": 5}, Standby(0), id="env-node-rank-beyond"),
        pytest.param({"pod_index": 0, "node_rank": -1}, Standby(0), id="env-negative-rank"),
    ],
)
def test_not_yet_published_the_env_says(env: dict[str, Any], role: contract.Role) -> None:
    assert pod_role(pod(**env)) == role
    assert pod_role(pod(**env), None) == role
    assert pod_as_of(pod(**env), None) == pod(**env)


def test_the_generation_the_env_was_written_for_goes_by_the_env() -> None:
    """The status publishes the env's own generation with no rank order: the env says."""
    mine = pod(pod_index=0, generation=2)
    assert pod_role(mine, Status(2, 2)) == Member(2, 0, 2)
    assert pod_as_of(mine, Status(2, 2)) is mine


def test_a_joiner_whose_generation_number_a_restart_took_goes_by_the_status() -> None:
    """A joiner created for generation 2 of a grow ranked after pod 1 (NODE_RANK 1, the
    rendezvous on pod 1); pod 1 was then lost too (a hard loss of the last survivor) and the
    restart published its own generation 2 in index order: pod 0 is rank 0 and hosts the
    rendezvous (found by bench/goodput.py: both pods took rank 1 and never formed)."""
    joiner = pod(pod_index=0, node_rank=1, generation=2, rdzv_host="job-worker-1.job.ns.svc")
    assert pod_role(joiner, Status(2, 2)) == Member(2, 0, 2)
    now = pod_as_of(joiner, Status(2, 2))
    assert (now.group_rank, now.rdzv_host) == (0, "job-worker-0.job.ns.svc")


def test_a_later_generation_or_a_rank_order_goes_by_the_status() -> None:
    standby = pod(pod_index=2, generation=1)
    assert pod_role(standby, Status(1, 2, (1, 0))) == Standby(1)
    assert pod_role(standby, Status(2, 2, (1, 2))) == Member(2, 1, 2)
    assert pod_role(pod(pod_index=1, generation=0), Status(1, 1, (0,))) == Standby(1)
    assert pod_role(pod(pod_index=1, generation=0), Status(1, 1)) == Standby(1)
    assert pod_role(pod(pod_index=0, generation=0), Status(1, 1)) == Member(1, 0, 1)


def test_pod_as_of_a_later_generation_takes_its_rank_size_and_rendezvous() -> None:
    now = pod_as_of(pod(pod_index=2, generation=1), Status(2, 2, (2, 0)))
    assert (now.generation, now.replicas, now.group_rank, now.node_rank) == (2, 2, 0, 0)
    assert now.rdzv_host == "job-worker-2.job.ns.svc"
    same = pod_as_of(pod(pod_index=1), Status(1, 2, (0, 1)))
    assert (same.group_rank, same.node_rank) == (1, None), "rank == index: no NODE_RANK"
    elsewhere = pod_as_of(pod(rdzv_host="10.0.0.5"), Status(1, 2, (1, 0)))
    assert elsewhere.rdzv_host == "10.0.0.5", "a host of the user's own is kept"


def test_every_role_is_matched() -> None:
    """The runtime branches on the role with match + assert_never: both are dataclasses."""
    for role in (Member(0, 0, 1), Standby(0)):
        match role:
            case Member(node_rank=rank):
                assert rank == 0
            case Standby(generation=g):
                assert g == 0


def test_the_controller_starts_a_standbys_workers_unformed_and_a_members_at_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a caught ValueError from Placement used to decide: a standby (no rank in the
    generation its env names) starts its processes unformed, and never leads."""
    from torchjob.train import RunConfig, TorchTrainer

    def controller(env: PodEnv) -> tuple[Controller, list[tuple[Placement, dict[str, str]]]]:
        c = Controller(
            TorchTrainer(lambda: None, run_config=RunConfig(storage_path=str(tmp_path))), env
        )
        c.mode = KeepSurvivorsMode(  # type: ignore[arg-type]
            None, Membership(env.generation, env.replicas), pod_index=env.pod_index
        )
        seen: list[tuple[Placement, dict[str, str]]] = []
        monkeypatch.setattr(c.workers, "prestart", lambda p, e, _pod, _view: seen.append((p, e)))
        with ProgressView(enabled=False, total_epochs=None) as view:
            c._prestart(RunState(num_workers=2), view)
        return c, seen

    standby, seen = controller(pod(pod_index=3, nproc_per_node=2, generation=1, membership=KEEP))
    assert standby._role() == Standby(1) and not standby._leads() and standby.storage is None
    assert seen == [(Placement.local(2, generation=1), {})]

    member, seen = controller(pod(pod_index=1, nproc_per_node=2, generation=1, membership=KEEP))
    assert member._role() == Member(1, 1, 2) and not member._leads()
    assert [(p.rank_offset, p.world_size, e) for p, e in seen] == [
        (2, 4, {"TORCHJOB_GENERATION": "1", "TORCHJOB_REPLICAS": "2"})
    ]
    leader, _ = controller(pod(pod_index=0, generation=1, membership=KEEP))
    assert leader._leads() and leader.storage is not None
