"""What a Prometheus scrape costs the operator at 100 running jobs (issue 41's measure:
under 1 % of its CPU when scraped every 15 s).

The operator runs as a local process against the kwok control plane with ``--jobs``
TorchJobs of ``--pods`` pods each, all Running, each with a 20-record ``status.history`` and a
progress report (what a long-lived job's status holds). Two measurements:

1. **Side by side**: windows of ``--window`` seconds with no scrape and with a scrape every
   ``--interval`` seconds, in ABBA order over ``--pairs`` pairs; the operator's CPU seconds
   (``/proc/<pid>/stat``) of each window, and their ratio. Everything else the operator does
   (its resyncs, the pod watch) runs in both.
2. **Per scrape**: in a quiet moment, ``--burst`` scrapes back to back; the operator's CPU
   over them divided by their number. That cost at one scrape per ``--interval`` over the
   operator's own CPU rate (the no-scrape windows) is the share a 15 s scrape costs.

    python bench/metrics_scrape.py [--jobs 100] [--pods 8] [--window 60] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    REPO,
    apply,
    cluster_down,
    cluster_up,
    kubectl,
    logger,
    spread,
    start_torchjob_operator,
    wait_established,
    wait_for,
)
from bench.operator_jobs import bench_nodes

log = logger("metrics-scrape")


def job(i: int, pods: int) -> dict[str, Any]:
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": {"name": f"scraped-{i:03d}", "namespace": "default"},
        "spec": {
            "replicas": pods,
            "template": {
                "spec": {
                    "containers": [{"name": "trainer", "image": "fake", "command": ["train"]}],
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"operator": "Exists"}],
                }
            },
        },
    }


def progress(generation: int) -> dict[str, Any]:
    """Rank 0's report and a long job's history, written as their writers would."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    history = [
        {"generation": g, "began": now, "cause": "Disruption", "worldSize": 8, "left": [f"p-{g}@n"]}
        for g in range(20)
    ]
    return {
        "status": {
            "progress": {"step": 1000, "generation": generation, "updateTime": now},
            "history": history,
        }
    }


def reporter(kubeconfig: Path, jobs: int, every: float, stop: threading.Event) -> None:
    """Rank 0's progress report of each job every ``every`` seconds (``JobStatusReporter``
    writes at most one each 5 s), spread evenly: what a job that trains sends the operator."""
    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    step, at = 1000, time.monotonic()
    while not stop.is_set():
        step += 1
        for i in range(jobs):
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            body = {"status": {"progress": {"step": step, "generation": 0, "updateTime": now}}}
            api.patch_namespaced_custom_object_status(
                "torchjob.io", "v1alpha1", "default", "torchjobs", f"scraped-{i:03d}", body
            )
            at += every / jobs
            if stop.wait(max(0.0, at - time.monotonic())):
                return


def scrape(port: int) -> int:
    return len(page(port))


def page(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return bytes(r.read())


def own_count(port: int) -> float:
    """The operator's own ``torchjob_scrape_cpu_seconds_total`` (every request answered before
    this one, this one not yet)."""
    for line in page(port).decode().splitlines():
        if line.startswith("torchjob_scrape_cpu_seconds_total "):
            return float(line.split()[1])
    raise RuntimeError("the operator's page has no torchjob_scrape_cpu_seconds_total")


def window(proc: Any, seconds: float, port: int | None, interval: float) -> tuple[float, int]:
    """The operator's CPU seconds over ``seconds``, scraping every ``interval`` when ``port``."""
    stop = threading.Event()
    count = [0]

    def scraper() -> None:
        while not stop.wait(interval):
            scrape(port)  # type: ignore[arg-type]
            count[0] += 1

    t = threading.Thread(target=scraper, daemon=True)
    before = proc.cpu_s()
    if port is not None:
        t.start()
    time.sleep(seconds)
    stop.set()
    after = proc.cpu_s()
    return after - before, count[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--pods", type=int, default=8)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument(
        "--report-every",
        type=float,
        default=0.0,
        help="each job's rank 0 reports progress every this many seconds (0: jobs never report)",
    )
    p.add_argument("--burst", type=int, default=200)
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--cluster-name", default="bench-scrape")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "metrics_scrape.json")
    args = p.parse_args(argv)
    kubeconfig = cluster_up(args.cluster_name)
    try:
        apply(kubeconfig, *bench_nodes(args.jobs * args.pods))
        kubectl(kubeconfig, "apply", "--server-side", "-f", str(REPO / "crds"))
        wait_established(kubeconfig, "crd/torchjobs.torchjob.io")
        proc, port = start_torchjob_operator(kubeconfig, Path(tempfile.mkdtemp(prefix="scrape-")))
        try:
            return measure(args, kubeconfig, proc, port)
        finally:
            proc.stop()
    finally:
        cluster_down(args.cluster_name)


def measure(args: argparse.Namespace, kubeconfig: Path, proc: Any, port: int) -> int:
    apply(kubeconfig, *(job(i, args.pods) for i in range(args.jobs)))

    def running() -> bool:
        out = json.loads(kubectl(kubeconfig, "get", "tj", "-o", "json"))
        return (
            sum((o.get("status") or {}).get("phase") == "Running" for o in out["items"])
            == args.jobs
        )

    wait_for(f"{args.jobs} jobs Running", running, 900, interval=2.0)
    for i in range(args.jobs):
        patch = json.dumps(progress(0))
        kubectl(
            kubeconfig,
            "patch",
            "tj",
            f"scraped-{i:03d}",
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        )
    stop = threading.Event()
    if args.report_every > 0:
        threading.Thread(
            target=reporter, args=(kubeconfig, args.jobs, args.report_every, stop), daemon=True
        ).start()
    try:
        return _measure(args, proc, port)
    finally:
        stop.set()


def _measure(args: argparse.Namespace, proc: Any, port: int) -> int:
    size = scrape(port)
    log(
        f"{args.jobs} jobs x {args.pods} pods Running; /metrics is {size / 1024:.0f} KiB; settling 30 s"
    )
    time.sleep(30)
    off: list[float] = []
    on: list[float] = []
    counted: list[float] = []
    """Per scraped window: the scrapes' CPU by the operator's own counter."""
    scrapes = 0
    for pair in range(args.pairs):
        order = (None, port) if pair % 2 == 0 else (port, None)
        for which in order + order[::-1]:
            c0 = own_count(port)  # outside the window; counted in the next reading
            cpu, n = window(proc, args.window, which, args.interval)
            (on if which else off).append(cpu)
            scrapes += n
            if which:  # the reading before the window is one request more than the window's
                counted.append((own_count(port) - c0) * n / (n + 1))
            log(f"pair {pair}: {'scraped' if which else 'not scraped'}: {cpu:.2f} s CPU")
    bursts = []
    for _ in range(args.bursts):  # the CPU counter ticks every 10 ms: long bursts, repeated
        before = proc.cpu_s()
        for _ in range(args.burst):
            scrape(port)
        bursts.append((proc.cpu_s() - before) / args.burst)
    per_scrape = statistics.median(bursts)
    base_rate = statistics.median(off) / args.window
    share = per_scrape / args.interval / base_rate if base_rate else float("nan")
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    reports = f", each reporting every {args.report_every:g} s" if args.report_every else ""
    print(
        f"\nscraping the operator every {args.interval:.0f} s at {args.jobs} running jobs x "
        f"{args.pods} pods{reports}"
    )
    print(f"  operator CPU per {args.window:.0f} s window, no scrape : {spread(off)} s")
    print(
        f"  operator CPU per {args.window:.0f} s window, scraped   : {spread(on)} s ({scrapes} scrapes)"
    )
    print(f"  scraped / not scraped, window by window      : {spread(ratios, '{:.3f}')}x")
    print(
        f"  one scrape ({args.bursts} x {args.burst} back to back)    : "
        f"{spread([b * 1000 for b in bursts], '{:.2f}')} ms CPU, {scrape(port) / 1024:.0f} KiB"
    )
    print(
        f"  one scrape per {args.interval:.0f} s over the operator's own CPU: {100 * share:.2f} %"
    )
    own = [c / w for c, w in zip(counted, on, strict=True)]
    print(
        "  the scrapes' CPU by the operator's own counter, share of each scraped window: "
        f"{spread([100 * x for x in own], '{:.2f}')} % "
        f"({1000 * sum(counted) / max(1, scrapes):.2f} ms a scrape)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "off": off,
                "on": on,
                "bursts_s": bursts,
                "per_scrape_s": per_scrape,
                "share": share,
                "report_every_s": args.report_every,
                "own_counter_s": counted,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
