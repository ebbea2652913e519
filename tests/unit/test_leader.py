"""Leader election rounds over an in-memory Lease API and a fake clock (the cluster test,
tests/cluster/test_leader_election.py, kills a real leader)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from torchjob_operator.engine.leader import LeaderElector, Record, may_take
from torchjob_operator.engine.settings import ElectionConfig


class FakeLeases:
    """CoordinationV1Api's lease calls, with resourceVersion conflicts."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    def _view(self) -> Any:
        assert self.lease is not None
        spec = self.lease["spec"]
        return SimpleNamespace(
            metadata=SimpleNamespace(resource_version=str(self.version)),
            spec=SimpleNamespace(
                holder_identity=spec["holderIdentity"],
                renew_time=spec["renewTime"],
                acquire_time=spec["acquireTime"],
                lease_transitions=spec["leaseTransitions"],
            ),
        )

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        if self.lease is None:
            raise ApiException(status=404, reason="NotFound")
        return self._view()

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.lease, self.version = copy.deepcopy(body), self.version + 1

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> None:
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        self.lease, self.version = copy.deepcopy(body), self.version + 1


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def _elector(api: FakeLeases, identity: str, clock: Clock) -> LeaderElector:
    config = ElectionConfig(namespace="ops", identity=identity, lease_duration_s=15)
    return LeaderElector(
        api,  # type: ignore[arg-type]
        config,
        on_started=lambda: None,
        on_stopped=lambda: None,
        clock=clock,
    )


def test_may_take() -> None:
    rec = Record(holder="a", renew_time="t1")
    assert may_take(None, identity="b", observed_at=0, now=0, lease_duration_s=15)
    assert may_take(rec, identity="a", observed_at=0, now=0, lease_duration_s=15)
    assert not may_take(rec, identity="b", observed_at=0, now=14.9, lease_duration_s=15)
    assert may_take(rec, identity="b", observed_at=0, now=15, lease_duration_s=15)


def test_a_standby_takes_over_only_after_the_lease_duration_without_renewals() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(10):  # a renews every 2 s: b never may take it
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "a"
    # a stops renewing (killed): b takes the lease once its record is 15 s old on b's clock.
    clock.t += 14
    assert not b.try_acquire_or_renew()
    clock.t += 1
    assert b.try_acquire_or_renew()
    spec = api.lease["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    # The old leader, back, may not take it while b renews.
    assert not a.try_acquire_or_renew()


def test_two_candidates_cannot_both_win_one_round() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b observes a's record at t=0
    clock.t = 20.0  # a's record looks expired to b ...
    read = api.read_namespaced_lease

    def read_then_a_renews(name: str, namespace: str, **kw: Any) -> Any:
        seen = read(name, namespace, **kw)
        api.read_namespaced_lease = read  # type: ignore[method-assign]
        assert a.try_acquire_or_renew()  # ... but a renews between b's read and b's write
        return seen

    api.read_namespaced_lease = read_then_a_renews  # type: ignore[method-assign]
    assert not b.try_acquire_or_renew(), "b's write carried a stale resourceVersion"
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "a"


def test_the_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        ElectionConfig(namespace="x", lease_duration_s=5, renew_deadline_s=10)


def test_a_released_lease_is_taken_at_once() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.leading.set()  # as its election thread does after winning
    assert a.release()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew(), "no lease-duration wait after a release"
    spec = api.lease["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert not a.release(), "a standby has nothing to release"
