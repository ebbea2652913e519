"""The zygote with real processes (``torchjob.launch.zygote``): a killed worker's signal still
reaches the driver, a dead zygote falls back to fresh interpreters, and a process that touched
CUDA is never forked for a worker (on this CPU machine the touch is a real
``torch.cuda.is_available()``/``device_count()`` call: it fills c10's device-count cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.kube import scaled

_KILLS = textwrap.dedent(
    """
    import json, os, signal, time
    import torch
    from torchjob.launch import WorkerDiedError, WorkerGroup, zygote

    def died(group, pid):
        running = group.submit(time.sleep, (120,))
        os.kill(pid, signal.SIGKILL)
        try:
            running.wait(grace_s=0.2, loss_grace_s=0.2)
        except WorkerDiedError as err:
            return [err.rank, err.exitcode, str(err)]
        return None

    from torchjob.launch import request_stop, stop_requested, worker_state

    out = {}
    worker_state()["driver's"] = 1  # in the driver, so in its copy, the zygote
    request_stop()
    g = WorkerGroup(2, backend="gloo")
    g.start()
    z = zygote._ZYGOTES["copy"]
    out["method"], out["ppids"], out["zygote"] = g.start_method, g.execute(os.getppid), z.pid
    out["fresh"] = g.execute(lambda: [sorted(worker_state()), stop_requested()])
    out["killed"] = died(g, g.pids[1])
    g.shutdown(timeout_s=0)
    h = WorkerGroup(1, backend="gloo")
    h.start()
    os.kill(z.pid, signal.SIGKILL)  # the zygote dies; the worker it started lives on
    out["survivor"] = h.execute(lambda: os.getpid()) == h.pids
    k = WorkerGroup(1, backend="gloo")
    k.start()
    out["after"] = [k.start_method, k.execute(os.getppid) == [os.getpid()]]
    k.shutdown()
    out["orphan"] = died(h, h.pids[0])
    h.shutdown(timeout_s=0)
    print(json.dumps(out))
    """
)


def _run(
    script: str, *args: str, path: str = "", omp_threads: str | None = "1"
) -> tuple[dict[str, Any], str]:
    """Run ``script`` as a driver; its last line of output, as JSON, and its stderr.
    ``omp_threads``: the workers' ``OMP_NUM_THREADS`` (None: unset, as in a one-worker pod)."""
    env = {**os.environ, "TORCHJOB_WORKER_START": "auto"}
    env.pop("OMP_NUM_THREADS", None)
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = omp_threads
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(500),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_killed_workers_signal_reaches_the_driver_and_a_dead_zygote_falls_back() -> None:
    out, stderr = _run(_KILLS)
    assert out["method"] == "zygote"
    assert out["ppids"] == [out["zygote"]] * 2  # not the driver's children
    # A forked worker starts with a WorkerProcess of its own, not the zygote's copy of the
    # driver's: no worker_state, no stop flag.
    assert out["fresh"] == [[[], False]] * 2
    # The zygote reaped rank 1 and sent its status: the driver names the signal.
    assert out["killed"] == [1, -9, "rank 1 worker process died: killed by SIGKILL"]
    # With the zygote gone, its worker still runs, new ones are fresh interpreters (a log line
    # says why), and a worker it started that dies is still seen dying.
    assert out["survivor"] is True
    assert out["after"] == ["spawn", True]
    assert "zygote" in stderr and "starting workers as fresh interpreters" in stderr
    assert out["orphan"] == [0, 256, "rank 0 worker process died: exited, status unknown (the "
                             "zygote that started it is gone)"]  # fmt: skip


_TOUCHED = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torchjob.launch import WorkerGroup, cuda_guard, zygote

    out = {}
    cuda_guard.install_tripwire()
    out["clean"] = cuda_guard.cuda_touched()
    torch.cuda.device_count()
    out["device_count"] = [torch.cuda.is_initialized(), cuda_guard.cuda_touched()]
    cuda_guard._TOUCHED.clear()
    torch.cuda.is_available()
    out["is_available"] = cuda_guard.cuda_touched()
    # This driver cannot be copied; the fresh zygote imports a module that asks torch.cuda
    # too (as many training scripts do at import): it refuses, and a zygote of torch alone
    # takes its place.
    out["kind"] = zygote.prepare([sys.argv[1]])
    first = zygote._ZYGOTES["fresh"]
    with WorkerGroup(1, backend="gloo") as g:
        out["method"] = g.start_method
        out["ppid"] = g.execute(os.getppid)[0]
    out["dead"] = first.dead
    second = zygote._ZYGOTES["fresh"]
    out["second"] = [second.pid, second.extra, second.dead]
    # A failed attempt to initialize CUDA (no GPU here) leaves no flag in this process, but
    # its children are bad forks: the guard asks one.
    try:
        torch.cuda.current_device()
    except Exception:
        pass
    out["failed_init"] = [cuda_guard.cuda_touched(), cuda_guard.cuda_touched(probe_fork=True)]
    print(json.dumps(out))
    """
)


def test_a_process_that_asked_torch_cuda_is_never_forked(tmp_path: Path) -> None:
    (tmp_path / "asks_cuda.py").write_text("import torch\nHAS_GPU = torch.cuda.is_available()\n")
    out, stderr = _run(_TOUCHED, "asks_cuda", path=str(tmp_path))
    assert out["clean"] is None
    # is_initialized() says no; the guard says yes.
    assert out["device_count"] == [False, "torch.cuda.is_available()/device_count() was called"]
    assert out["is_available"] == "torch.cuda.is_available()/device_count() was called"
    assert out["kind"] == "fresh"
    assert "it touched CUDA" in str(out["dead"])
    second_pid, extra, dead = out["second"]
    assert out["method"] == "zygote" and out["ppid"] == second_pid, out
    assert extra == [] and dead is None, out["second"]
    assert "starting workers as fresh interpreters" not in stderr
    if not out["failed_init"][0]:  # on a GPU-less host (CI): only the probe sees it
        assert "tried to initialize CUDA" in out["failed_init"][1], out["failed_init"]


_OPENMP = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torchjob.launch import WorkerGroup, zygote

    def parallel_op():
        import torch
        torch.ones(1 << 17).exp_()  # one OpenMP parallel region (four times the grain size)
        return torch.get_num_threads()

    if sys.argv[1] == "pool":
        torch.ones(1 << 20).exp_()  # the driver's own OpenMP pool starts here
    out = {}
    g = WorkerGroup(1, backend="gloo", start_timeout_s=120)
    g.start()
    out["kind"] = next(k for k, z in zygote._ZYGOTES.items() if z.pid == g.execute(os.getppid)[0])
    out["threads"] = g.execute(parallel_op)
    out["driver_threads"] = torch.get_num_threads()
    g.shutdown()
    print(json.dumps(out))
    """
)


def test_a_driver_without_an_openmp_pool_is_copied_for_workers_of_any_thread_count() -> None:
    """One worker per pod leaves ``OMP_NUM_THREADS`` unset. A driver that imported torch but ran
    no parallel op has no OpenMP pool, so its copy serves such a worker (no second import of
    torch); once the driver ran a parallel op, a fork would hang in its first parallel
    region, so the worker comes from a fresh zygote. Either way the worker's op completes."""
    for case, kind in (("clean", "copy"), ("pool", "fresh")):
        out, _ = _run(_OPENMP, case, omp_threads=None)
        assert out["kind"] == kind, (case, out)
        # The worker runs as many intra-op threads as the driver (not pinned to one).
        assert out["threads"] == [out["driver_threads"]], (case, out)


def test_a_zygote_dropped_with_its_message_unread_exits_quietly() -> None:
    """The driver drops a fresh zygote whose preloads touched CUDA without reading its
    answer; the zygote then reads a reset, not an end of file. It exits as on a close, with
    no traceback: on a GPU machine every ``fit()`` printed one (2026-12-04, the H200)."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    code = "import sys; from torchjob.launch._zygote_proc import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        stderr=subprocess.PIPE,
        env=env,
    )
    theirs.close()
    ours.settimeout(scaled(120))
    ours.recv(4096, socket.MSG_PEEK)  # its ZygoteReady has arrived; it stays unread
    ours.close()  # a close with the zygote's message unread: it reads ECONNRESET
    _, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err, err.decode()[-2000:]
