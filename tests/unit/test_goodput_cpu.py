"""bench/goodput_cpu.py: the per-second CPU record of a goodput row, and who it charges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench import goodput_cpu as cpu

HZ = os.sysconf("SC_CLK_TCK")
UID_A = "0f8b6a3c-1111-4222-8333-444455556666"
UID_B = "9e1d2c3b-aaaa-4bbb-8ccc-dddd00001111"


def test_proc_stat_reads_the_machines_line_not_a_cpus() -> None:
    text = "cpu0 1 2 3 4 5 6 7 8\ncpu  10 1 20 300 4 0 7 0 0 0\nintr 5\n"
    got = cpu.proc_stat(text)
    assert got["user"] == 10 and got["idle"] == 300 and got["softirq"] == 7
    with pytest.raises(ValueError, match="cpu"):
        cpu.proc_stat("intr 5\n")


@pytest.mark.parametrize(
    ("name", "uid"),
    [
        (f"pod{UID_A}", UID_A),
        (f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice", UID_A),
        ("burstable", None),
        ("podnot-a-uid", None),
    ],
)
def test_pod_uid_of_a_kubelet_cgroup(name: str, uid: str | None) -> None:
    assert cpu.pod_uid(name) == uid


def test_sample_reads_nodes_and_their_pods_v1_and_v2(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 0 1 10 0 0 0 0\n")
    v1 = tmp_path / "real-0"
    (v1 / "kubepods" / "burstable" / f"pod{UID_A}").mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("5000\n")
    (v1 / "kubepods" / "burstable" / f"pod{UID_A}" / "cpuacct.usage").write_text("3000\n")
    v2 = tmp_path / "real-1"
    (v2 / "kubepods" / f"pod{UID_B}").mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 7\nuser_usec 5\n")
    (v2 / "kubepods" / f"pod{UID_B}" / "cpu.stat").write_text("usage_usec 2\n")
    got = cpu.sample({"a": v1, "b": v2}, stat)
    assert got["nodes"] == {"a": 5000, "b": 7000}
    assert got["pods"] == {UID_A: 3000, UID_B: 2000}
    assert got["host"]["idle"] == 10


def _cpu(t: float, busy: int, idle: int, node: float, pods: dict[str, float]) -> dict[str, object]:
    """A ``cpu`` line: host jiffies, node and pod seconds (as ns)."""
    host = dict.fromkeys(cpu.STAT_FIELDS, 0) | {"user": busy, "idle": idle}
    ns = {uid: int(s * 1e9) for uid, s in pods.items()}
    return {"t": t, "what": "cpu", "host": host, "nodes": {"n": int(node * 1e9)}, "pods": ns}


def _pod(
    t: float, name: str, uid: str, *, ready: bool, deleting: bool = False
) -> dict[str, object]:
    return {"t": t, "what": "pod", "pod": name, "uid": uid, "ready": ready, "deleting": deleting}


def test_cpu_by_role_charges_each_second_to_what_each_pod_was_doing() -> None:
    # Two CPUs. gp-worker-0 a member throughout; gp-worker-1 created at 0.5 (starting), Ready
    # at 1.5 (waiting: not in the members), a member from 2.5, deleted at 3.5.
    trace = [
        {"t": 0.0, "what": "job", "members": [0]},
        _pod(0.1, "gp-worker-0", UID_A, ready=True),
        _cpu(1.0, 0, 0, 0.0, {UID_A: 0.0, UID_B: 0.0}),
        _pod(0.5, "gp-worker-1", UID_B, ready=False),
        _cpu(2.0, 2 * HZ, 0, 1.9, {UID_A: 1.0, UID_B: 0.8}),
        _pod(1.5, "gp-worker-1", UID_B, ready=True),
        _cpu(3.0, 3 * HZ, HZ, 3.4, {UID_A: 2.0, UID_B: 1.2}),
        {"t": 2.5, "what": "job", "members": [0, 1]},
        _cpu(4.0, 5 * HZ, HZ, 5.3, {UID_A: 3.0, UID_B: 2.0}),
        _pod(3.5, "gp-worker-1", UID_B, ready=True, deleting=True),
        _cpu(5.0, 6 * HZ, 2 * HZ, 6.2, {UID_A: 3.6, UID_B: 2.2}),
    ]
    got = cpu.cpu_by_role(trace, 0.0, 10.0)
    assert got["capacity"] == pytest.approx(8.0)
    assert got["busy"] == pytest.approx(6.0)
    assert got["members"] == pytest.approx(3.6 + 0.8)
    assert got["starting"] == pytest.approx(0.8)
    assert got["waiting to join"] == pytest.approx(0.4)
    assert got["leaving"] == pytest.approx(0.2)
    # The node's CPU less its pods', 0.1 each second.
    assert got["node daemons"] == pytest.approx(0.4)
    # The host's busy time less the nodes', each second (never below 0): 0.1 + 0 + 0.1 + 0.1.
    assert got["outside"] == pytest.approx(0.3)


def test_a_member_that_restarts_unready_is_still_a_member_not_a_starting_pod() -> None:
    p = {"pod": "gp-worker-3", "ready": False, "deleting": False}
    assert cpu.role(p, [3], ever_member=True) == "members"
    assert cpu.role(p, [3], ever_member=False) == "starting"
    assert cpu.role(p, None, ever_member=False) == "starting"
    assert cpu.role({**p, "ready": True}, [1, 2], ever_member=False) == "waiting to join"


def test_a_trace_without_cpu_lines_says_nothing() -> None:
    assert cpu.cpu_lines([{"t": 0.0, "what": "job", "members": None}], 0.0, 1.0) == []
