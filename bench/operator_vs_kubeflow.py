"""Operator cost at scale: torchjob side by side with Kubeflow's training-operator v1.8.1.

One private kwokctl cluster (real kube-apiserver, scheduler and controller-manager; kwok
plays the kubelets), both operators running at once as local processes, the same pod
image and requests: a TorchJob of 8 replicas against a PyTorchJob of 1 Master + 7 Workers.
Bursts of N jobs alternate between the two (which goes first flips every repeat) and the
figures are medians over the repeats. Prints figures, ratios and the issue-11 targets;
asserts nothing and never runs in ``make test``.

    python bench/operator_vs_kubeflow.py [--sizes 20,100] [--repeats 2] [--scale-jobs 1000]
    make bench-operator                      # the same, with the defaults

Kubeflow's operator is built with ``go install`` from the Go module proxy into
``$TORCHJOB_TESTBIN_ROOT/kubeflow-training-operator-v1.8.1`` (about 2.5 minutes cold).
v1.8.1 cannot turn its webhook off: the benchmark creates its namespace and an empty
``training-operator-webhook-cert`` Secret, and copies the self-signed certificate that the
operator writes into that Secret to the directory its webhook server waits on. No webhook
configuration is registered, so the webhook never sees a request.

Measured:
- burst: submit N jobs at once; time until every pod exists, every pod is Running and every
  job reports Running; pods created per second;
- the operators' own CPU-seconds (``/proc/<pid>/stat``) during each burst, also the CPU an
  operator spends on the *other* operator's burst, and over the whole run;
- RSS (``/proc/<pid>/status``) idle, with N jobs present, and after all were deleted;
- reactions with the N=``--react-size`` jobs running: one worker exits non-zero, a pod is
  evicted (Eviction API), rank 0 is deleted: time until the job has all its pods Running again;
- idle API requests per second of running jobs: the operator (API server metrics over a
  window in which only that operator has jobs) and the in-pod agents (torchjob's runtime
  code following membership, run here for every pod of one job with the job's own
  ServiceAccount token; their requests are counted client-side).

The machine this runs on matters: on a shared laptop or CI runner the figures are noisy;
compare ratios from one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    REPO,
    Proc,
    apply,
    cluster_down,
    cluster_up,
    kubectl,
    log,
    median,
    start_torchjob_operator,
    wait_established,
)
from bench.kubeflow import build_kubeflow, start_kubeflow
from bench.operator_bench import Bench
from bench.operator_jobs import KF, PODS_PER_JOB, TJ, TJ_GROUP, TJ_PLURAL, bench_nodes
from bench.operator_report import fmt, report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--sizes", default="20,100,500", help="burst sizes N (jobs of 8 pods), e.g. 20,100,500"
    )
    p.add_argument(
        "--repeats", type=int, default=2, help="runs of each burst, alternating who goes first"
    )
    p.add_argument(
        "--react-size", type=int, default=100, help="the N whose jobs the reactions run on"
    )
    p.add_argument(
        "--react-jobs", type=int, default=5, help="jobs per failure kind (evictions: 2x)"
    )
    p.add_argument(
        "--idle-window", type=float, default=60.0, help="seconds of idle request counting (0: skip)"
    )
    p.add_argument(
        "--scale-jobs",
        type=int,
        default=0,
        help="then torchjob alone with this many jobs (e.g. 1000)",
    )
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds to wait before reading RSS after deletes"
    )
    p.add_argument("--cluster-name", default=os.environ.get("TORCHJOB_CLUSTER_NAME", "bench"))
    p.add_argument(
        "--keep-cluster", action="store_true", help="leave the cluster running at the end"
    )
    p.add_argument("--json", type=Path, help="also write the raw figures here")
    p.add_argument(
        "--profile",
        type=Path,
        help="record torchjob-operator with py-spy (pip install py-spy; the thread holding the "
        "GIL, i.e. its Python CPU) into this file, in "
        "py-spy's raw (collapsed stacks) format; it samples without stopping the process",
    )
    args = p.parse_args(argv)  # fmt: skip
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s]
    return args


def _profile(pid: int, into: Path) -> subprocess.Popen[bytes]:
    """py-spy recording the process ``pid`` (the torchjob-operator) into ``into``."""
    return subprocess.Popen(
        [shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
         "record", "--pid", str(pid), "--nonblocking", "--gil", "--rate", "100",
         "--format", "raw", "--output", str(into)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _bursts(args: argparse.Namespace, bench: Bench) -> None:
    """Every size's bursts, ``--repeats`` times; which operator goes first flips each repeat."""
    for n in args.sizes:
        for repeat in range(args.repeats):
            order = (TJ, KF) if repeat % 2 == 0 else (KF, TJ)
            for flavor in order:
                bench.burst(
                    flavor, n, repeat,
                    react=n == args.react_size, idle=n == args.react_size and repeat == 0,
                )  # fmt: skip


def _scale_line(bench: Bench, n: int, idle_mib: float) -> str:
    """The line of the ``--scale-jobs`` run (torchjob alone)."""
    m = lambda key: median(bench.results.get((key, "tj"), []))  # noqa: E731
    return (
        f"\n{n} TorchJobs x 8 pods (torchjob alone): pods created {fmt(m(f'n{n}.created'), ' s')}, "
        f"all Running {fmt(m(f'n{n}.running'), ' s')}, jobs Running {fmt(m(f'n{n}.jobs'), ' s')}, "
        f"operator CPU {fmt(m(f'n{n}.cpu'), ' s')} ({fmt(m(f'n{n}.cpu_per_pod_ms'), ' ms')}/pod), "
        f"RSS {fmt(m(f'n{n}.rss_loaded'), ' MiB', 0)} loaded, "
        f"{fmt(bench.results[('rss_after_delete', 'tj')][-1], ' MiB', 0)} after deletion "
        f"(idle {idle_mib:.0f} MiB)"
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A TERM (or INT in the background) still stops both operators and deletes the cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import torchjob_operator

    log(f"torchjob-operator from {Path(torchjob_operator.__file__).parent}")
    from kubernetes import client, config

    kf_binary, kf_crd = build_kubeflow()
    log(f"cluster '{args.cluster_name}' up (hack/cluster.sh)")
    kubeconfig = cluster_up(args.cluster_name)
    api = config.new_client_from_config(str(kubeconfig))
    api.configuration.connection_pool_maxsize = 32
    core = client.CoreV1Api(api)
    max_pods = PODS_PER_JOB * max([*args.sizes, args.scale_jobs])
    apply(kubeconfig, *bench_nodes(max_pods))
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(REPO / "crds"))
    wait_established(kubeconfig, f"crd/{TJ_PLURAL}.{TJ_GROUP}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-operators-"))
    procs: dict[str, Proc] = {}
    profiler: subprocess.Popen[bytes] | None = None
    try:
        log("starting Kubeflow training-operator and torchjob-operator")
        procs["kf"] = start_kubeflow(kf_binary, kf_crd, kubeconfig, core, workdir)
        procs["tj"], tj_metrics_port = start_torchjob_operator(kubeconfig, workdir)
        if args.profile:
            profiler = _profile(procs["tj"].popen.pid, args.profile)
        time.sleep(args.settle)
        idle = {k: p.rss_mib() for k, p in procs.items()}
        cpu_start = {k: p.cpu_s() for k, p in procs.items()}
        log(
            f"idle RSS: torchjob {idle['tj']:.0f} MiB, Kubeflow {idle['kf']:.0f} MiB; logs in {workdir}"
        )
        bench = Bench(args, kubeconfig, api, procs, tj_metrics_port)
        _bursts(args, bench)
        whole = {k: p.cpu_s() - cpu_start[k] for k, p in procs.items()}
        if args.scale_jobs:
            cpu0 = procs["tj"].cpu_s()
            bench.burst(TJ, args.scale_jobs, 0, react=False, idle=False)
            log(
                f"scale: torchjob CPU over the {args.scale_jobs}-job run {procs['tj'].cpu_s() - cpu0:.1f}s"
            )
        report(bench, args, whole, idle)
        if args.scale_jobs:
            print(_scale_line(bench, args.scale_jobs, idle["tj"]))
        if args.json:
            args.json.write_text(
                json.dumps({f"{k}|{f}": v for (k, f), v in bench.results.items()}, indent=1)
            )
        for p in procs.values():
            if not p.alive():
                print(f"warning: {p.name} exited early; see {p.log_path}")
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(60)
            log(f"profile of torchjob-operator in {args.profile}")
        for p in procs.values():
            p.stop()
        if not args.keep_cluster:
            cluster_down(args.cluster_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
