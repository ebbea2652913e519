"""A real-node pod's processes, seen from this host: the node's kubelet runs its containers
here, in cgroups that name the pod's UID (as bench/goodput.py finds them), so a test can
SIGKILL a pod's trainer or drop its packets in its network namespace (iptables through
``nsenter``), the way a node that vanishes would."""

from __future__ import annotations

import subprocess
from pathlib import Path


def pod_processes(uid: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process in the pod's cgroups."""
    keys = (uid, uid.replace("-", "_"))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if any(key in cgroup for key in keys) and cmdline:
            found.append((int(entry.name), cmdline))
    return sorted(found)


def trainer_pid(uid: str) -> int | None:
    """The pod's worker process (the rank that runs the training function: a fresh
    interpreter, ``python -m torchjob.launch._entry``), if it runs."""
    return next((pid for pid, cmd in pod_processes(uid) if "torchjob.launch._entry" in cmd), None)


def drop_packets(pid: int) -> None:
    """Drop every packet in and out of the network namespace of ``pid`` (its pod's): a node
    that vanished, seen by its peers: no FIN, no RST, no answer."""
    for chain in ("INPUT", "OUTPUT"):
        subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "iptables", "-I", chain, "-j", "DROP"],
            check=True,
            capture_output=True,
            timeout=30,
        )
