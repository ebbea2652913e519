"""Run a TorchJob manifest on this machine: one subprocess per worker "pod".

``torchjob run -f job.yaml`` calls :func:`run_local`. Each of ``spec.replicas``
local pods runs the template's first container (``command`` + ``args``) with
the container's ``env`` plus the variables the operator would give the pod
(:meth:`torchjob.contract.PodEnv.to_env`), rendezvous on ``127.0.0.1`` and a
free port. So a manifest that works here sees the same environment contract on
the cluster. What the local runner does not do: images, volumes, ``valueFrom``
env, resources (other than counting GPUs for ``nprocPerNode: gpu``).

Failure semantics are the operator's (``torchjob.rules``, the same functions): when a
pod ends the whole group is stopped and judged, and what it was is the one loss model's
(``torchjob.rules.classify``): a process killed by a signal from outside with no evidence
of the OOM killer is a disruption (never charged), a process that exited
``contract.STOPPED_EXIT_CODE`` stopped as asked (never charged), an OOM kill (the cgroup's
``oom_kill`` counter moved, or the pod's runtime said ``oom``) or any other non-zero exit a
failure: a permanent exit code (``spec.failurePolicy``) ends the run, otherwise the group
restarts as the next generation (``TORCHJOB_GENERATION`` and ``TORCHELASTIC_RESTART_COUNT``
incremented) after the policy's backoff, while ``maxRestarts`` allows. Each pod's
termination message (``TORCHJOB_TERMINATION_LOG``, a file per pod here) is read as the
operator reads a container's: a worker process of the pod killed from outside, or a pod that
failed only because a peer did. ``activeDeadlineSeconds`` ends the run when it expires.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from torchjob import contract
from torchjob.client.manifest import Manifest
from torchjob.client.members import LocalDecision, LocalMember, decide, process_member
from torchjob.rules import Counters, RestartRules, deadline_left
from torchjob.rules.worker_env import worker_pod_env

__all__ = [
    "LocalDecision",
    "LocalMember",
    "LocalRunResult",
    "decide",
    "pod_env",
    "process_member",
    "run_local",
]

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
    """The environment of local pod ``index``: ours, then the template's, then the contract's
    (built by ``worker_pod_env``, as the operator builds a pod's)."""
    container = manifest.container()
    pod = worker_pod_env(
        manifest.job.spec,
        job_name=manifest.name,
        namespace=manifest.namespace or "default",
        index=index,
        generation=generation,
        replicas=manifest.replicas,
        rdzv_host="127.0.0.1",
        rdzv_port=port,
        nproc_per_node=nproc,
    )
    env = dict(os.environ)
    env.update(container.env)
    env.update(pod.to_env())
    env[contract.POD_NAME] = contract.worker_pod_name(manifest.name, index)
    return env


class _TerminationLogs:
    """One termination log per local pod (``TORCHJOB_TERMINATION_LOG``), read back as the
    operator reads a container's termination message."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="torchjob-run-"))
        weakref.finalize(self, shutil.rmtree, self.dir, True)

    def fresh(self, index: int) -> str:
        path = self.dir / f"pod-{index}.log"
        path.unlink(missing_ok=True)
        return str(path)

    def read(self, index: int) -> contract.TerminationSummary | None:
        try:
            return contract.parse_termination_message((self.dir / f"pod-{index}.log").read_text())
        except OSError:
            return None


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


@dataclass
class _Pods:
    """One generation's local pods: their processes, the threads that print their output,
    and their exits as ``(index, exit code)`` in the order they came."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pumps: list[threading.Thread] = field(default_factory=list)
    exits: queue.Queue[tuple[int, int]] = field(default_factory=queue.Queue)

    def start(
        self,
        index: int,
        argv: list[str],
        env: dict[str, str],
        *,
        cwd: str | None,
        printer: _Printer,
    ) -> None:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        pump = threading.Thread(target=_pump, args=(proc, index, printer), daemon=True)
        pump.start()
        self.pumps.append(pump)
        threading.Thread(target=_await_exit, args=(proc, index, self.exits), daemon=True).start()

    def stop(self, grace_period_s: float, *, join_s: float) -> None:
        """Stop every pod (``_stop``), then give their output ``join_s`` to drain."""
        _stop(self.procs, grace_period_s)
        for pump in self.pumps:
            pump.join(timeout=join_s)


@dataclass(frozen=True)
class _Run:
    """What stays the same across a local run's generations: the job, its rules, its
    deadline, when it started, and where it says what happened."""

    manifest: Manifest
    rules: RestartRules
    deadline_s: int | None
    start_time: datetime
    printer: _Printer

    def watch(
        self,
        pods: _Pods,
        counters: Counters,
        *,
        oom_before: int | None,
        said: _TerminationLogs,
    ) -> tuple[LocalDecision, dict[int, int]]:
        """Follow the generation's pods until the rules decide something other than
        ``continue`` (the deadline is one of the things they judge); returns the decision
        and the exit codes seen by then."""
        name = self.manifest.name
        codes: dict[int, int] = {}
        members = [process_member(name, i, None) for i in range(self.manifest.replicas)]
        decision = LocalDecision("continue", counters)
        while decision.action == "continue":
            left = deadline_left(self.deadline_s, self.start_time, _now())
            try:
                idx, rc = pods.exits.get(
                    timeout=None if left is None else min(max(left, 0.0), threading.TIMEOUT_MAX)
                )
            except queue.Empty:
                pass
            else:
                codes[idx] = rc
                oom = rc == -signal.SIGKILL and contract.oom_since(oom_before)
                members[idx] = process_member(name, idx, rc, _now(), oom=oom, said=said.read(idx))
            decision = decide(
                self.rules,
                self.deadline_s,
                counters,
                members,
                start_time=self.start_time,
                now=_now(),
            )
        return decision, codes

    def say_culprit(self, decision: LocalDecision, codes: dict[int, int]) -> None:
        """Name the pod whose end the decision is about, unless the job succeeded."""
        if decision.culprit is None or decision.action == "succeed":
            return
        rc = codes.get(decision.culprit, 0)
        # A pod taken away, or stopped as asked, did not fail (its loss is not charged).
        how = "ended" if decision.reason == "WorkerDisrupted" else "failed"
        self.printer.note(
            f"pod {contract.worker_pod_name(self.manifest.name, decision.culprit)} {how}: "
            f"exit code {rc}"
        )

    def result(
        self, decision: LocalDecision, codes: dict[int, int], counters: Counters
    ) -> LocalRunResult | None:
        """The run's result when the decision ends it (succeed or fail); None when the group
        restarts. ``counters`` are the generation's, before the decision."""
        generations = counters.generation + 1
        if decision.action == "succeed":
            self.printer.note(f"job {self.manifest.name} succeeded")
            return LocalRunResult(0, generations, None, codes)
        if decision.action == "fail":
            self.printer.note(
                f"job {self.manifest.name} failed ({decision.reason}): {decision.detail} "
                f"(restarts used {counters.restarts}/{self.rules.max_restarts})"
            )
            rc = codes.get(decision.culprit, 1) if decision.culprit is not None else 1
            return LocalRunResult(rc if rc > 0 else 128 - rc, generations, decision.culprit, codes)
        return None


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
    spec = manifest.job.spec
    rules = RestartRules.of(spec.failure_policy)
    if max_restarts is not None:
        rules = replace(rules, max_restarts=max_restarts)
    run = _Run(manifest, rules, spec.run_policy.active_deadline_seconds, _now(), printer)
    counters = Counters()
    said = _TerminationLogs()
    while True:
        generation = counters.generation
        oom_before = contract.oom_kills()  # the OOM killer's evidence, if a pod is SIGKILLed
        port = contract.free_port()
        printer.note(
            f"job {manifest.name}: generation {generation}, {manifest.replicas} pod(s) x "
            f"{nproc} proc(s), rendezvous 127.0.0.1:{port}"
        )
        pods = _Pods()
        for i in range(manifest.replicas):
            env = pod_env(manifest, index=i, port=port, generation=generation, nproc=nproc)
            env[contract.TERMINATION_LOG] = said.fresh(i)
            pods.start(i, argv, env, cwd=container.working_dir, printer=printer)
        try:
            decision, codes = run.watch(pods, counters, oom_before=oom_before, said=said)
        except KeyboardInterrupt:
            printer.note("interrupted: stopping all pods")
            pods.stop(grace_period_s, join_s=5)
            return LocalRunResult(
                130, generation + 1, None, {i: p.returncode for i, p in enumerate(pods.procs)}
            )
        run.say_culprit(decision, codes)
        pods.stop(grace_period_s, join_s=30)
        ended = run.result(decision, codes, counters)
        if ended is not None:
            return ended
        counters = decision.counters
        wait = f" in {decision.backoff_s:g}s" if decision.backoff_s else ""
        printer.note(
            f"{decision.reason}: {decision.detail}; restarting the group as generation "
            f"{counters.generation}{wait} ({counters.restarts}/{rules.max_restarts} "
            f"restarts, {counters.disruptions} disruptions)"
        )
        if decision.backoff_s:
            time.sleep(decision.backoff_s)


def _now() -> datetime:
    return datetime.now(timezone.utc)
