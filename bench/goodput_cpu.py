"""Who took the CPU during a goodput row: a per-second record in the row's trace, and its
reading.

The real nodes share the machine's CPUs (hack/node.sh: each node a cgroup of equal weight),
so a joiner importing torch on one node, or a leaver finishing on another, slows the members'
steps as it never would on a fleet whose nodes have CPUs of their own. A row whose steps were
slower than its baseline's must say whether that is what happened. ``CpuSampler`` adds a
``cpu`` line to the trace every second: the host's ``/proc/stat`` counters, each real node's
cgroup CPU time, and each pod's (by UID, from the kubelet's ``pod<uid>`` cgroups).
:func:`cpu_by_role` reads them beside the trace's pod and job lines: the CPU-seconds the
members took, pods starting (created, not yet Ready), Ready ones waiting to join, pods
leaving (from their deletion to their end), the nodes' daemons and other pods, and what ran outside the nodes (the control
plane, the operator when it is not on a real node, the bench itself).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
IDLE_FIELDS = ("idle", "iowait")
ROLES = ("members", "starting", "waiting to join", "leaving", "other")
"""A pod's role at a moment (:func:`role`); ``other``: a pod of the row none of these."""

_POD_DIR = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


def proc_stat(text: str) -> dict[str, int]:
    """The machine's CPU counters (jiffies) from ``/proc/stat``'s first line."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            return dict(zip(STAT_FIELDS, values, strict=False))
    raise ValueError("no 'cpu ' line in /proc/stat")


def pod_uid(dirname: str) -> str | None:
    """The pod UID of a kubelet pod cgroup's name (``pod<uid>``, cgroupfs; or systemd's
    ``kubepods-burstable-pod<uid with _>.slice``); None for any other directory."""
    m = _POD_DIR.search(dirname)
    return m.group(1).replace("_", "-") if m else None


def usage_ns(cg: Path) -> int | None:
    """A cgroup's CPU time in nanoseconds (v1 ``cpuacct.usage``, v2 ``cpu.stat``); None
    when it is gone (a pod ended between the listing and the read)."""
    try:
        if (v1 := cg / "cpuacct.usage").exists():
            return int(v1.read_text())
        for line in (cg / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) * 1000
    except (OSError, ValueError):
        return None
    return None


def sample(nodes: Mapping[str, Path], stat: Path = Path("/proc/stat")) -> dict[str, Any]:
    """One ``cpu`` trace line's fields: ``host`` (jiffies by field), ``nodes`` (ns by node
    name) and ``pods`` (ns by UID, every pod cgroup under a node's)."""
    pods: dict[str, int] = {}
    node_ns: dict[str, int] = {}
    for name, cg in nodes.items():
        if (ns := usage_ns(cg)) is not None:
            node_ns[name] = ns
        for d in cg.glob("kubepods/**/pod*"):
            uid = pod_uid(d.name)
            if uid is not None and (ns := usage_ns(d)) is not None:
                pods[uid] = ns
    return {"host": proc_stat(stat.read_text()), "nodes": node_ns, "pods": pods}


class CpuSampler:
    """A daemon thread that calls ``note("cpu", **sample(nodes))`` every ``interval_s``."""

    def __init__(
        self,
        nodes: Mapping[str, Path],
        note: Callable[..., None],
        interval_s: float = 1.0,
    ) -> None:
        self.nodes, self.note, self.interval_s = dict(nodes), note, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.note("cpu", **sample(self.nodes))
            except (OSError, ValueError):  # a read that failed: the next second reads again
                continue

    def stop(self) -> None:
        self._stop.set()


def node_cgroups(names: Iterable[str], cluster: str) -> dict[str, Path]:
    """Real node K's CPU cgroup by name (hack/node.sh: ``/torchjob-<cluster>/real-K``, v1 in
    the cpuacct hierarchy); those that do not exist (no real nodes here) are left out."""
    base = Path("/sys/fs/cgroup")
    root = base / "cpuacct" if not (base / "cgroup.controllers").exists() else base
    out = {}
    for k, name in enumerate(names):
        cg = root / f"torchjob-{cluster}" / f"real-{k}"
        if cg.is_dir():
            out[name] = cg
    return out


def _pod_index(name: str) -> int | None:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def role(pod: Mapping[str, Any], members: Iterable[int] | None, ever_member: bool) -> str:
    """What a pod of the row was doing, from its last trace line and the job's members then
    (pod indices; None: every pod is a member, as before the first re-formation)."""
    if pod.get("deleting"):
        return "leaving"
    index = _pod_index(str(pod.get("pod", "")))
    if members is None or (index is not None and index in set(members)):
        return "members" if pod.get("ready") or ever_member else "starting"
    return "waiting to join" if pod.get("ready") else "starting"


def cpu_by_role(trace: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    """CPU-seconds over [t0, t1] by :data:`ROLES`, plus ``node daemons`` (the nodes' CPU
    less their pods': kubelet, containerd, CoreDNS, other namespaces' pods), ``outside``
    (the host's busy time less the nodes'), ``busy`` and ``capacity`` (CPUs x seconds), and
    ``softirq``. Each interval between two ``cpu`` lines is charged to the roles the pods
    had at its start; a pod the trace has not seen (another namespace's) to ``other``."""
    hz = os.sysconf("SC_CLK_TCK")
    out = dict.fromkeys((*ROLES, "node daemons", "outside", "busy", "capacity", "softirq"), 0.0)
    pods: dict[str, dict[str, Any]] = {}
    was_member: set[str] = set()
    members: list[int] | None = None
    prev: dict[str, Any] | None = None
    roles: dict[str, str] = {}
    for e in sorted(trace, key=lambda e: e["t"]):
        if e["what"] == "pod":
            pods[e["uid"]] = e
        elif e["what"] == "job" and e.get("members") is not None:
            members = list(e["members"])
        elif e["what"] == "cpu":
            if prev is not None and t0 <= prev["t"] and e["t"] <= t1:
                _charge(out, prev, e, roles, hz)
            prev = e
            roles = {uid: role(p, members, uid in was_member) for uid, p in pods.items()}
            was_member.update(uid for uid, r in roles.items() if r == "members")
    return out


def _charge(
    out: dict[str, float],
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    roles: Mapping[str, str],
    hz: int,
) -> None:
    """Charge the interval from ``cpu`` line ``a`` to ``b`` to ``roles`` (each pod's at ``a``)."""
    total = sum(b["host"].values()) - sum(a["host"].values())
    idle = sum(b["host"][f] - a["host"][f] for f in IDLE_FIELDS)
    out["capacity"] += total / hz
    out["busy"] += (total - idle) / hz
    out["softirq"] += (b["host"]["softirq"] - a["host"]["softirq"]) / hz
    nodes = sum(b["nodes"][n] - a["nodes"][n] for n in b["nodes"] if n in a["nodes"]) / 1e9
    in_pods = 0.0
    for uid, ns in b["pods"].items():
        if uid in a["pods"]:
            used = (ns - a["pods"][uid]) / 1e9
            in_pods += used
            out[roles.get(uid, "other")] += used
    out["node daemons"] += max(nodes - in_pods, 0.0)
    out["outside"] += max((total - idle) / hz - nodes, 0.0)


def cpu_lines(trace: list[dict[str, Any]], t0: float, t1: float) -> list[str]:
    """The row's CPU by role, as lines (none when the trace has no ``cpu`` record)."""
    if not any(e["what"] == "cpu" for e in trace):
        return []
    c = cpu_by_role(trace, t0, t1)
    cap = c["capacity"] or 1.0
    out = [
        f"CPU over {t1 - t0:.0f}s: {c['capacity']:.0f} CPU-s, busy {c['busy'] / cap:.1%} "
        f"(softirq {c['softirq'] / cap:.1%})"
    ]
    for name in (*ROLES, "node daemons", "outside"):
        out.append(f"  {name:<17} {c[name]:8.1f} CPU-s  {c[name] / cap:6.1%}")
    return out


__all__ = [
    "ROLES",
    "CpuSampler",
    "cpu_by_role",
    "cpu_lines",
    "node_cgroups",
    "pod_uid",
    "proc_stat",
    "role",
    "sample",
    "usage_ns",
]
