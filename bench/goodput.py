"""Goodput under a fleet's losses: what a lost pod or node costs a TorchJob, on real nodes.

The real nodes (kubelet + containerd, hack/node.sh; ``TORCHJOB_REAL_NODES``, 3 for the node
modes), the operator installed by the Helm chart (tests/cluster/realnode.py), and one TorchJob
per row running bench/_goodput_worker.py: fixed-cost steps written the way docs/runtime.md
tells users to write a loop (a checkpoint every ``--ckpt-every`` steps and on
``should_stop()``), over ``--state-mib`` MiB of model + Adam state per worker
(bench/_goodput_state.py; 0, the default: ``Linear(16, 1)``). Each row takes ``--evictions``
losses (bench/goodput_losses.py), on a schedule (bench/goodput_schedule.py):

- ``--schedule poisson`` (default): the row's loss times are drawn before it starts from its
  seeded random source (the same draw for every system's row of a mode in a repeat, so that
  torchjob and Kubeflow meet the same loss times), cumulative exponential gaps of mean ``--mtbf``, and each loss is
  taken at its time whatever the job is doing (a recovery too); the row ends a mean interval
  after the last loss's node is gone (``--node-mtbf`` for the node modes). The table lists
  each row's realised rate beside the stated one; ``--schedule after-recovery``: each loss a
  mean interval (+-20 %) after the previous recovery (before issue 39; kinder than a fleet).

Modes (``--modes``; a node loss is a node loss for Kubeflow's rows too):

- ``graceful``: a random running pod, the Eviction API, its ``terminationGracePeriodSeconds``;
- ``hard``: a random running pod's processes SIGKILLed on the host (no SIGTERM, nothing saved);
- ``vanish``: a random real node that runs a running pod of the job and not the operator (nor
  a kube-system pod) vanishes (its link cut, every process frozen: hack/node.sh vanish),
  taking every pod on it; its pods' processes are killed as soon as it is gone, the link
  still cut (hack/node.sh reclaim: a gone VM's memory is its own, not this machine's), unless
  ``--thaw``; it returns ``--node-return`` seconds later (a new VM), in the background;
- ``notice30`` / ``notice120``: such a node gets GKE's (30 s) / AWS NTH's (120 s) notice now,
  a drain through the Eviction API 10 s before it goes, gone after 30 / 120 s; it returns
  ``--node-return`` seconds after it went. Its recovery is timed from the notice.

Each loss's recovery is resolved from the workers' events after the row: the first completed
rank-0 step of a generation above the one stepping at the loss (overlapping losses each get
theirs); a loss without one within ``--start-timeout`` (or before the row's end) is listed as
not recovered, never dropped. ``--restore-point`` also runs the torchjob baseline without
``register_state`` (unless ``--no-restore-point-baseline``), before the loss rows and after
them in the reverse order (torchjob, Kubeflow, without; the rows; without, Kubeflow, torchjob:
a linear drift of the machine's speed cancels): the restore point's overhead,
1 - rate(with) / rate(without), is printed beside the usual baseline.

Per policy (``RecreateGroup``, ``KeepSurvivors``, ``Elastic`` = KeepSurvivors with
``elastic.minReplicas = replicas - 1``, ``Standby`` = that with ``elastic.standbyReplicas``
(``--standby``, default 1) and ``shrinkOnDisruption``) and per mode it prints (the losses hit
every running pod of the job, standbys included, each at the same rate):

- goodput: the samples trained in the row's window / (ideal rate x the same wall time), the
  median [min-max] over ``--repeats`` runs. Each system's ideal rate (torchjob's, and
  Kubeflow's when it runs) is measured in the same invocation by its own row without
  evictions (same job, full size), before the loss rows and again after them (the median;
  ``--no-bracket``: before only). The window runs from the job's first step to the row's
  end (the job deleted; what it trains after does not count); the samples are the
  lineage's at its end less those at its start, from rank 0's step events (what a later
  restore threw away does not count), capped by storage's latest committed checkpoint after
  the row (work never saved is lost; such a row says so). Pure: bench/goodput_accounting.py;
- goodput per pod paid: goodput x workers / (workers + standbys), and the pod count;
- goodput per pod-second paid, measured: goodput x workers x wall / the pod-seconds the row's
  trace shows over the same window (``acc.pod_seconds``: a pod is paid from the kubelet
  having it until it is gone or terminated, so an evicted pod's grace period and a
  replacement created ahead of its predecessor's end are both charged);
- a timeline per row (``--out``, SVG): rank 0's steps/s over time, each eviction marked;
- recovery p50/p95: the loss -> the first completed step of a later generation (rank 0's);
- lost steps: steps done before an eviction that the next membership did not resume from;
- restarts charged (``status.restarts``) and disruptions (``status.disruptions``);
- the median time in each phase of a recovery (bench/goodput_records.py ``PHASES``: operator
  reaction, pod start, imports, group, DDP, restore, first step).

Parts of one long run (``--repeat-from``, one ``--out`` each, ``run.json`` naming the code:
bench/goodput_runs.py) are read back as one table by bench/goodput_recompute.py.

    python bench/goodput.py [--mtbf 60] [--grace 30] [--evictions 10] [--replicas 2]
                            [--policies RecreateGroup,KeepSurvivors,Elastic,Standby,Kubeflow]
                            [--modes graceful,hard,vanish,notice30,notice120] [--seed 0]
                            [--schedule poisson] [--node-mtbf 120] [--node-return 60]
                            [--state-mib 0] [--repeats 3] [--repeat-from 0]
                            [--restore-point] [--keep-cluster]
    make bench-goodput            # 3 spot nodes, 8 pods, every mode, both systems: 12-15 h

``Kubeflow`` is what a user would pick instead: Kubeflow's PyTorchJob v1.8.1 with
``elasticPolicy`` under torchrun (``kubeflow_manifest``), the training-operator built and run
as in bench/operator_vs_kubeflow.py, the same node, evictions and loop
(bench/_goodput_torchrun.py).

It asserts nothing and never runs in ``make test``. The figures depend on the machine: on a
shared, loaded machine compare the rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import kube as k
from tests.cluster.realnode import HelmOperator, RealNode, real_node_count

from bench import goodput_accounting as acc
from bench import goodput_schedule as sch
from bench.goodput_jobs import KUBEFLOW, POLICIES, STRATEGIES, add_worker_env
from bench.goodput_losses import disk_too_full, release_system_node, reserve_system_node
from bench.goodput_records import Row
from bench.goodput_report import report, write_timelines
from bench.goodput_rows import log, run_row
from bench.goodput_runs import record_run
from bench.harness import REPO, cluster_down

OPERATOR_NS = "torchjob-system"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mtbf", type=float, default=60.0, help="seconds between preemptions")
    p.add_argument("--grace", type=int, default=30, help="terminationGracePeriodSeconds")
    p.add_argument("--evictions", type=int, default=10, help="preemptions per row")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument(
        "--strategies",
        default="ddp",
        help="workloads, each with its own baseline: ddp (bench/_goodput_worker.py), fsdp "
        "(FSDP2 + sharded TrainState checkpoints, bench/_goodput_fsdp_worker.py); Kubeflow "
        "runs ddp only",
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        default=0,
        help="elastic minimum of the Elastic and Standby rows and of Kubeflow's elasticPolicy "
        "(default: replicas - 1; with node modes, replicas less one node's share of an even "
        "spread: the survivors of a node loss go on at once)",
    )
    p.add_argument(
        "--ideal",
        default="",
        help="SYSTEM=RATE[,...]: take this ideal rate (samples/s) from an earlier run's baseline "
        "row of the same size instead of running that system's baseline (e.g. Kubeflow=2200)",
    )
    p.add_argument("--cpu-request", default="100m", help="each worker pod's CPU request")
    p.add_argument("--memory-request", default="256Mi", help="each worker pod's memory request")
    p.add_argument(
        "--modes",
        default="graceful,hard",
        help="losses: graceful, hard (a pod), vanish, notice30, notice120 (a node and every "
        "pod on it; needs TORCHJOB_REAL_NODES >= 2); '' runs the baselines only",
    )
    p.add_argument("--baseline-seconds", type=float, default=0.0,
                   help="length of the row without evictions (default: mtbf x (evictions+1))")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--shrink-on-disruption",
        action="store_true",
        help="the Elastic row goes on with the survivors at once (spec.elastic.shrinkOnDisruption)",
    )
    p.add_argument(
        "--standby", type=int, default=1, help="the Standby row's spec.elastic.standbyReplicas"
    )
    p.add_argument(
        "--restore-point",
        action="store_true",
        help="torchjob rows hand their state to register_state and report every step: a hard "
        "loss resumes from the survivors' memory (storage checkpoints stay the fallback)",
    )
    p.add_argument(
        "--in-place",
        action="store_true",
        help="with --restore-point: register_state(in_place=True), so that a shrink's "
        "survivors go on inside the training function (torchjob.train.recovery.in_place)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of every row (median printed)")
    p.add_argument("--repeat-from", type=int, default=0,
                   help="the first repeat's number (its loss draws): a part of a long run")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "goodput",
                   help="directory of the timeline plots (one SVG per row)")  # fmt: skip
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--keep-cluster", action="store_true", help="leave the cluster and node up")
    sch.add_fleet_args(p)
    add_worker_env(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    args.run_id = time.strftime("%H%M%S")
    job_nodes = real_node_count() - (1 if args.system_node else 0)
    args.min_replicas = args.min_replicas or sch.default_min_replicas(
        args.replicas, args.modes.split(","), job_nodes
    )
    ideal: dict[str, float] = {}
    for item in filter(None, args.ideal.split(",")):
        system, _, rate = item.partition("=")
        try:
            ideal[system] = float(rate)
        except ValueError:
            p.error(f"--ideal: {item!r} is not SYSTEM=RATE (e.g. Kubeflow=2200.5)")
    args.ideal = ideal
    if not 1 <= args.min_replicas <= args.replicas:
        p.error(f"--min-replicas must be between 1 and --replicas ({args.replicas})")
    for pol in args.policies.split(","):
        if pol not in POLICIES:
            p.error(f"--policies: unknown policy {pol!r} ({', '.join(POLICIES)})")
    for strategy in args.strategies.split(","):
        if strategy not in STRATEGIES:
            p.error(f"--strategies: unknown strategy {strategy!r} ({', '.join(STRATEGIES)})")
    for mode in filter(None, args.modes.split(",")):
        if mode not in sch.MODES:
            p.error(f"--modes: unknown mode {mode!r} ({', '.join(sch.MODES)})")
    if args.mtbf <= 0 or args.state_mib < 0:
        p.error("--mtbf must be positive and --state-mib not negative")
    return args


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def baseline_order(
    systems: list[tuple[str, str]], plain: bool, after: bool
) -> list[tuple[str, str] | None]:
    """The baselines a part runs before its loss rows (``after``: after them), in order;
    None is torchjob's without restore points (``plain``). After the rows the order is
    reversed (A B C ... C B A), so that torchjob's two baselines and the two without restore
    points have the same mean time: a drift of the machine's speed that is linear over the
    part cancels out of the overhead."""
    order: list[tuple[str, str] | None] = [*systems, *([None] if plain else [])]
    return order[::-1] if after else order


def _run_rows(
    args: argparse.Namespace, cluster: k.Cluster, core: Any, custom: Any
) -> tuple[list[Row], list[Row]]:
    """Every row, ``--repeats`` times: each system's baseline, then each mode, workload and
    policy under its storm; (baselines, rows). Interrupted, it returns the rows that
    finished."""
    duration = args.baseline_seconds or args.mtbf * (args.evictions + 1)
    policies = args.policies.split(",")
    # Each system's own baseline: torchjob's (RecreateGroup without evictions) and, when
    # it runs, Kubeflow's; every row is divided by its own system's rate.
    # Each workload (--strategies) is a system of its own with its own baseline too.
    strategies = args.strategies.split(",")
    systems = [("RecreateGroup", s) for s in strategies]
    if KUBEFLOW in policies:
        systems.append((KUBEFLOW, "ddp"))
    systems = [(p, s) for p, s in systems if acc.system_of(p, s) not in args.ideal]
    baselines: list[Row] = []
    rows: list[Row] = []
    index = 0

    plain = args.restore_point and not args.no_restore_point_baseline

    def run_baselines(rep: int, when: str, after: bool = False) -> None:
        nonlocal index
        for system in baseline_order(systems, plain, after):
            what = "without restore points" if system is None else "of {}/{}".format(*system)
            log(f"repeat {rep + 1}: baseline {what} {when}, {duration:.0f}s without evictions")
            policy, strategy = system or ("RecreateGroup", "ddp")
            row = run_row(
                args, cluster, core, custom, policy, "none", 0, duration, index, strategy,
                restore_point=False if system is None else None,
            )  # fmt: skip
            (rows if system is None else baselines).append(row)
            index += 1

    try:
        for rep in range(args.repeat_from, args.repeat_from + args.repeats):
            run_baselines(rep, "before the loss rows")
            for mode in filter(None, args.modes.split(",")):
                for strategy in strategies:
                    for policy in policies:
                        if policy == KUBEFLOW and strategy != "ddp":
                            continue
                        row = run_row(
                            args,
                            cluster,
                            core,
                            custom,
                            policy,
                            mode,
                            args.evictions,
                            0,
                            index,
                            strategy,
                            repeat=rep,
                        )
                        rows.append(row)
                        index += 1
            if not args.no_bracket and args.modes:
                # Bracketed: the rows ran between two baselines of each system.
                run_baselines(rep, "after the loss rows", after=True)
    except KeyboardInterrupt:
        # A stopped run keeps what it measured: the rows that finished are reported.
        log(f"interrupted: the table of the {len(baselines) + len(rows)} rows that finished")
        for ns in core.list_namespace().items:  # the row that was running
            if ns.metadata.name.startswith(f"goodput-{args.run_id}-"):
                core.delete_namespace(ns.metadata.name)
    return baselines, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kubernetes import client

    # A run started in the background ignores SIGINT (the shell's rule for background jobs),
    # so SIGTERM and SIGINT both stop it the way Ctrl-C does: the finished rows' table, then
    # the clean-up.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)

    problem = RealNode.prerequisites_problem()
    if problem:
        print(f"the real node cannot run here: {problem}", file=sys.stderr)
        return 2
    node_modes = set(args.modes.split(",")) & set(sch.NODE_MODES)
    if node_modes and real_node_count() < 2:
        print(f"--modes {','.join(sorted(node_modes))}: needs TORCHJOB_REAL_NODES >= 2 (one "
              "runs the operator)", file=sys.stderr)  # fmt: skip
        return 2
    if args.spares and real_node_count() - 1 <= args.spares:
        print(f"--spares {args.spares}: needs TORCHJOB_REAL_NODES > {args.spares + 1} (the "
              "operator's node, the spares, and spot nodes to train on)", file=sys.stderr)  # fmt: skip
        return 2
    full = disk_too_full()
    if full:
        print(full, file=sys.stderr)
        return 2
    started = time.monotonic()
    info = record_run(args.out, REPO, sys.argv if argv is None else argv)
    log(f"code of {info['commit'][:9]}{' (with uncommitted changes)' if info['dirty'] else ''}")
    log("cluster up")
    kubeconfig = k.cluster_up()
    cluster = k.Cluster(kubeconfig=kubeconfig)
    log("images and the real node")
    node = RealNode.start()
    log(f"real nodes {', '.join(node.names)}: " + ", ".join(f"{n} {s:.0f}s" for n, s in node.timings.items()))  # fmt: skip
    args.nodes = node  # what the node modes take and bring back (bench/goodput_losses.py)
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    op = HelmOperator(cluster, core, OPERATOR_NS, "torchjob")
    op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
    with tempfile.TemporaryDirectory() as d:
        op.install(Path(d) / "values.yaml", "--create-namespace")
    cluster.wait_established("torchjobs.torchjob.io")
    system = reserve_system_node(core) if args.system_node else None
    if system:
        log(f"system node {system}: the job's pods run on the others")
    kubeflow = None
    workdir = Path(tempfile.mkdtemp(prefix="tj-goodput-"))
    try:
        if KUBEFLOW in args.policies.split(","):
            from bench import kubeflow as kf

            binary, crd = kf.build_kubeflow()
            kubeflow = kf.start_kubeflow(binary, crd, kubeconfig, core, workdir)
            log(f"Kubeflow training-operator {kf.KF_VERSION} runs (log {kubeflow.log_path})")
        baselines, rows = _run_rows(args, cluster, core, custom)
        report(args, baselines, rows)
        for path in write_timelines(args.out, baselines + rows):
            print(f"timeline: {path}")
    finally:
        if kubeflow is not None:
            kubeflow.stop()
        op.helm("uninstall", "torchjob", "--namespace", OPERATOR_NS, "--wait", check=False)
        if system:
            release_system_node(core, system)
        if not args.keep_cluster:
            cluster_down()
    log(f"done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
