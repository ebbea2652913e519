"""Two operator replicas elect a leader on a Lease; killing the leader hands over.

The standby must not reconcile while the leader lives (its per-job loops never start),
and must take over after the lease duration once the leader stops renewing (SIGKILL). A
leader stopped cleanly (SIGTERM) releases the lease so the next replica leads at once. The
takeover times are printed, not asserted (beyond the waits' generous timeouts).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import Jobs, OperatorProcess, torchjob

pytestmark = pytest.mark.cluster

# Short, for a quick takeover; times CI's scale, so that a leader starved of CPU for a few
# seconds does not lose its lease (it did at 1 CPU: "leader election lost", not released).
LEASE_S, RENEW_S, RETRY_S = k.scaled(4), k.scaled(3), 0.5


def _holder(coord: Any, ns: str, lease: str) -> str | None:
    try:
        return coord.read_namespaced_lease(lease, ns).spec.holder_identity  # type: ignore[no-any-return]
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_killing_the_leader_hands_over_to_the_standby(jobs: Jobs, tmp_path: Any) -> None:
    jobs.operator.stop()  # the suite's operator would reconcile this namespace too
    lease = "tj-test-leader"
    args = (
        "--leader-elect",
        f"--leader-election-namespace={jobs.ns}",
        f"--leader-election-id={lease}",
        f"--lease-duration={LEASE_S}",
        f"--renew-deadline={RENEW_S}",
        f"--retry-period={RETRY_S}",
        f"--namespace={jobs.ns}",
    )
    replicas = [OperatorProcess(jobs.cluster, tmp_path, args=args, tag=tag) for tag in ("-a", "-b")]
    coord = client.CoordinationV1Api(jobs.core.api_client)
    try:
        for r in replicas:
            r.start()
        by_pid = {str(r.proc.pid): r for r in replicas if r.proc is not None}
        holder = k.wait_for(lambda: _holder(coord, jobs.ns, lease), 30, "a leader")
        leader = by_pid[holder.rsplit("_", 1)[1]]
        standby = next(r for r in replicas if r is not leader)

        jobs.apply(torchjob("ha", replicas=2))
        jobs.wait_running_pods("ha", 2, generation=0)
        jobs.wait_phase("ha", "Running")
        assert "] phase " not in standby.logs(200), "the standby reconciled while the leader led"

        leader.kill()
        killed = time.monotonic()
        new = k.wait_for(
            lambda: (h := _holder(coord, jobs.ns, lease)) != holder and h,
            60,
            "the standby to take the lease",
            interval=0.1,
        )
        takeover = time.monotonic() - killed
        assert new.rsplit("_", 1)[1] == str(standby.proc.pid if standby.proc else "")
        print(
            f"leader takeover: {takeover:.1f}s after SIGKILL "
            f"(lease {LEASE_S}s, renew deadline {RENEW_S}s, retry {RETRY_S}s)"
        )
        # The new leader reconciles: a failure restarts the group.
        jobs.exit_pod("ha-worker-1", 1)
        jobs.wait_running_pods("ha", 2, generation=1, timeout=60)
        status = jobs.wait_phase("ha", "Running")
        assert (status["restarts"], status["disruptions"]) == (1, 0)
        assert "became leader" in standby.logs(400)

        # A clean shutdown (SIGTERM, as in a rolling upgrade) hands the lease back: the next
        # replica leads on its next round, without waiting out the lease duration.
        third = OperatorProcess(jobs.cluster, tmp_path, args=args, tag="-c")
        replicas.append(third)
        third.start()
        stopped = time.monotonic()
        standby.stop()
        assert "released the lease" in standby.logs(400)
        k.wait_for(
            lambda: (h := _holder(coord, jobs.ns, lease)) not in (new, "", None) and h,
            30,
            "the third replica to take the released lease",
            interval=0.1,
        )
        print(f"leader handover after SIGTERM: {time.monotonic() - stopped:.1f}s")
        jobs.exit_pod("ha-worker-0", 1)
        jobs.wait_running_pods("ha", 2, generation=2, timeout=60)
        assert jobs.wait_phase("ha", "Running")["restarts"] == 2
    finally:
        for r in replicas:
            r.kill()
