"""Run a TorchJob manifest on this machine: one subprocess per worker "pod".

``torchjob run -f job.yaml`` calls :func:`run_local`. Each of ``spec.replicas``
local pods runs the template's first container (``command`` + ``args``) with
the container's ``env`` plus the variables the operator would give the pod
(:meth:`torchjob.contract.PodEnv.to_env`), rendezvous on ``127.0.0.1`` and a
free port. So a manifest that works here sees the same environment contract on
the cluster. What the local runner does not do: images, volumes, ``valueFrom``
env, resources (other than counting GPUs for ``nprocPerNode: gpu``).

Failure semantics follow the operator's static mode: when any pod fails the
whole group is stopped and, while ``spec.failurePolicy.maxRestarts`` allows,
restarted as the next generation (with ``TORCHELASTIC_RESTART_COUNT`` and
``TORCHJOB_GENERATION`` incremented).
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO

from torchjob import contract
from torchjob.client.manifest import Manifest

_PYTHON_NAMES = ("python", "python3", f"python3.{sys.version_info.minor}")


@dataclass
class LocalRunResult:
    """Outcome of a local run: the exit code to report and what each pod did."""

    exit_code: int
    """0 when every pod of the last generation exited 0; else the root-cause pod's code."""
    generations: int
    """Number of generations started (1 + restarts)."""
    failed_pod: int | None = None
    """Index of the pod whose failure ended the run (the first to fail), if any."""
    pod_exit_codes: dict[int, int] = field(default_factory=dict)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the rendezvous port of a local generation)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def visible_gpu_count() -> int:
    """GPUs this machine would give a pod: ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def resolve_nproc_per_node(value: int | str) -> int:
    """``"gpu"``/``"auto"`` mean one process per visible GPU, or 1 on a machine without GPUs."""
    if value in ("gpu", "auto"):
        return max(1, visible_gpu_count())
    return int(value)


def pod_env(
    manifest: Manifest, *, index: int, port: int, generation: int, nproc: int
) -> dict[str, str]:
    """The environment of local pod ``index``: ours, then the template's, then the contract's."""
    container = manifest.container()
    pod = contract.PodEnv(
        job_name=manifest.name,
        namespace=manifest.namespace or "default",
        pod_index=index,
        replicas=manifest.replicas,
        min_replicas=manifest.min_replicas,
        max_replicas=manifest.max_replicas,
        nproc_per_node=nproc,
        generation=generation,
        rdzv_host="127.0.0.1",
        rdzv_port=port,
        backend=manifest.backend,
        checkpoint_path=manifest.checkpoint_path,
        mode="elastic" if manifest.elastic else "static",
        max_restarts=manifest.max_restarts,
    )
    env = dict(os.environ)
    env.update(container.env)
    env.update(pod.to_env())
    env[contract.POD_NAME] = contract.worker_pod_name(manifest.name, index)
    return env


def local_argv(argv: list[str]) -> list[str]:
    """The container's argv for this machine: ``python`` is the interpreter running torchjob."""
    if argv and argv[0] in _PYTHON_NAMES:
        return [sys.executable, *argv[1:]]
    return list(argv)


class _Printer:
    """Writes lines from many pods to one stream, whole lines at a time, prefixed by rank."""

    _COLORS = ("36", "33", "35", "32", "34", "31")

    def __init__(self, out: IO[str], color: bool) -> None:
        self._out = out
        self._color = color
        self._lock = threading.Lock()

    def line(self, index: int, text: str) -> None:
        prefix = f"[rank {index}]"
        if self._color:
            prefix = f"\x1b[{self._COLORS[index % len(self._COLORS)]}m{prefix}\x1b[0m"
        with self._lock:
            self._out.write(f"{prefix} {text}\n")
            self._out.flush()

    def note(self, text: str) -> None:
        with self._lock:
            self._out.write(f"[torchjob] {text}\n")
            self._out.flush()


def _pump(proc: subprocess.Popen[bytes], index: int, printer: _Printer) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        printer.line(index, raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    proc.stdout.close()


def _await_exit(
    proc: subprocess.Popen[bytes], index: int, exits: queue.Queue[tuple[int, int]]
) -> None:
    exits.put((index, proc.wait()))


def _stop(procs: list[subprocess.Popen[bytes]], grace_period_s: float) -> None:
    """SIGTERM every pod's process group, then SIGKILL what is left after the grace period."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace_period_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_local(
    manifest: Manifest,
    *,
    out: IO[str] | None = None,
    max_restarts: int | None = None,
    grace_period_s: float = 10.0,
    color: bool | None = None,
) -> LocalRunResult:
    """Run ``manifest`` as ``spec.replicas`` local processes; block until the job ends.

    Returns the outcome; ``exit_code`` is what ``torchjob run`` exits with.
    Ctrl-C stops every pod (SIGTERM, then SIGKILL after ``grace_period_s``) and
    returns exit code 130.
    """
    stream = out if out is not None else sys.stdout
    use_color = stream.isatty() if color is None else color
    printer = _Printer(stream, use_color)
    container = manifest.container()
    if not container.argv:
        raise ValueError(
            f"{manifest.source}: spec.template.spec.containers[0]: needs a command (or args) to run locally"
        )
    argv = local_argv(container.argv)
    nproc = resolve_nproc_per_node(manifest.nproc_per_node)
    budget = manifest.max_restarts if max_restarts is None else max_restarts
    generation = 0
    while True:
        port = free_port()
        printer.note(
            f"job {manifest.name}: generation {generation}, {manifest.replicas} pod(s) x "
            f"{nproc} proc(s), rendezvous 127.0.0.1:{port}"
        )
        procs: list[subprocess.Popen[bytes]] = []
        pumps: list[threading.Thread] = []
        exits: queue.Queue[tuple[int, int]] = queue.Queue()
        for i in range(manifest.replicas):
            env = pod_env(manifest, index=i, port=port, generation=generation, nproc=nproc)
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=container.working_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(proc)
            pump = threading.Thread(target=_pump, args=(proc, i, printer), daemon=True)
            pump.start()
            pumps.append(pump)
            threading.Thread(target=_await_exit, args=(proc, i, exits), daemon=True).start()
        codes: dict[int, int] = {}
        failed: int | None = None
        try:
            while len(codes) < len(procs):
                idx, rc = exits.get()
                codes[idx] = rc
                if rc != 0 and failed is None:
                    failed = idx
                    printer.note(
                        f"pod {contract.worker_pod_name(manifest.name, idx)} failed: exit code {rc}"
                    )
                    _stop(procs, grace_period_s)
        except KeyboardInterrupt:
            printer.note("interrupted: stopping all pods")
            _stop(procs, grace_period_s)
            for pump in pumps:
                pump.join(timeout=5)
            return LocalRunResult(
                130, generation + 1, None, {i: p.returncode for i, p in enumerate(procs)}
            )
        for pump in pumps:
            pump.join(timeout=30)
        if failed is None:
            printer.note(f"job {manifest.name} succeeded")
            return LocalRunResult(0, generation + 1, None, codes)
        if generation >= budget:
            printer.note(
                f"job {manifest.name} failed: pod {failed} exited {codes[failed]} "
                f"(restarts used {generation}/{budget})"
            )
            rc = codes[failed]
            return LocalRunResult(rc if rc > 0 else 128 - rc, generation + 1, failed, codes)
        generation += 1
        printer.note(
            f"restarting the group as generation {generation} ({generation}/{budget} restarts)"
        )
