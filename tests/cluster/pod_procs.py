"""A real-node pod's processes, seen from this host: the node's kubelet runs its containers
here, in cgroups that name the pod's UID (as bench/goodput.py finds them), so a test can
SIGKILL a pod's trainer or drop its packets in its network namespace (iptables through
``nsenter``), the way a node that vanishes would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.kube import wait_for


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


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, then ppid


def trainer_pid(uid: str) -> int | None:
    """The pod's worker process (the rank that runs the training function), if it runs: a
    spawned worker (``python -m torchjob.launch._entry``), or one forked by a zygote, which
    shows its zygote's command line (``torchjob.launch._zygote_proc``, or the driver's for a
    copy of the driver) and is the deepest process of the pod's tree (driver -> zygote ->
    worker, at least two levels down)."""
    procs = pod_processes(uid)
    spawned = next((pid for pid, cmd in procs if "torchjob.launch._entry" in cmd), None)
    if spawned is not None:
        return spawned
    in_pod = {pid for pid, _ in procs}
    parents = {pid: _ppid(pid) for pid in in_pod}

    def depth(pid: int) -> int:
        n, seen = 0, set()
        while (pid := parents.get(pid) or -1) in in_pod and pid not in seen:
            seen.add(pid)
            n += 1
        return n

    deepest = sorted(in_pod, key=lambda pid: (-depth(pid), pid))
    return deepest[0] if deepest and depth(deepest[0]) >= 2 else None


def drop_packets(uid: str, to: tuple[str, int] | None = None) -> None:
    """Drop every packet in and out of the network namespace of the pod ``uid``: a node that
    vanished, seen by its peers: no FIN, no RST, no answer. ``to`` (address, port): only
    those it sends to that TCP port (a broken route to one service; it still answers all).

    Any process of the pod names its namespace, but one may end between the look and the
    ``nsenter``: a pod's first processes include short-lived ones (seen in CI: a new pod whose
    only process was ``runc init``, gone a moment later). Its processes are tried oldest first
    (the sandbox's pause process lives as long as the pod), looking again until one enters."""
    rules = [["INPUT", "-j", "DROP"], ["OUTPUT", "-j", "DROP"]]
    if to is not None:
        rules = [["OUTPUT", "-p", "tcp", "-d", to[0], "--dport", str(to[1]), "-j", "DROP"]]
    tried: list[str] = []

    def entered() -> bool:
        for pid, cmd in pod_processes(uid):
            done = subprocess.run(
                ["nsenter", "-t", str(pid), "-n", "iptables", "-w", "-I", *rules[0]],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.returncode == 0:
                for rule in rules[1:]:
                    subprocess.run(
                        ["nsenter", "-t", str(pid), "-n", "iptables", "-w", "-I", *rule],
                        check=True,
                        capture_output=True,
                        timeout=30,
                    )
                return True
            tried.append(f"{pid} ({cmd}): exit {done.returncode}: {done.stderr.strip()}")
            if Path(f"/proc/{pid}").exists():  # nsenter or iptables failed, not a race
                raise RuntimeError(f"could not drop pod {uid}'s packets; tried {tried}")
        return False

    wait_for(entered, 30, lambda: f"pod {uid}'s packets dropped; tried {tried or 'no process'}")


def freeze_pod(uid: str) -> list[int]:
    """A pod gone silent the way a vanished node's pods do: its packets dropped (no FIN, no
    RST), then every one of its processes stopped (driver, workers, the store it serves).
    Returns the stopped pids (:func:`thaw` lets them go on)."""
    procs = [pid for pid, _ in pod_processes(uid)]
    if not procs:
        raise RuntimeError(f"pod {uid} has no processes on this host")
    drop_packets(uid)
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return procs


def thaw(pids: list[int]) -> None:
    """Let stopped processes go on (a test's clean-up: the kubelet's SIGKILL reaches a
    stopped process anyway, this only ends what is still stopped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
