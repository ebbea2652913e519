"""``python -m torchjob_operator`` / ``torchjob-operator``: run the operator against any kubeconfig."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

from torchjob_operator.common.nodes import parse_notice_taints
from torchjob_operator.engine import settings as settings_mod


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchjob-operator", description=__doc__)
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="serve only this namespace (repeatable); default: all",
    )
    defaults = settings_mod.OperatorSettings()  # one source for every default
    p.add_argument(
        "--resync-period",
        type=float,
        default=defaults.resync_period_s,
        help="seconds between idle reconciles of a job",
    )
    p.add_argument(
        "--create-concurrency",
        type=int,
        default=defaults.create_concurrency,
        help="pods created in parallel",
    )
    p.add_argument(
        "--max-concurrent-reconciles",
        type=int,
        default=defaults.max_concurrent_reconciles,
        help="jobs reconciled at once",
    )
    p.add_argument(
        "--cache-deadline",
        type=float,
        default=defaults.cache_deadline_s,
        help="seconds a job waits for the watches to show its last writes before it reads the "
        "API server instead of the cache",
    )
    p.add_argument(
        "--job-sweep",
        type=float,
        default=defaults.job_sweep_s,
        help="seconds between LISTs of the TorchJobs that drop from the cache any job deleted "
        "without a watch event",
    )
    _node_args(p)
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)"
    )
    p.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    p.add_argument(
        "--leader-elect",
        action="store_true",
        help="elect one leader among replicas on a coordination.k8s.io Lease (for replicas > 1)",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else default)",
    )
    p.add_argument("--leader-election-id", default="torchjob-operator", help="name of the Lease")
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds (client-go's)")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (client-go's)")
    p.add_argument("--retry-period", type=float, default=2.0, help="seconds (client-go's)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def _node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--notice-taints",
        default="default",
        help="the Node taints that announce a node's end, as key[=value]:seconds (the notice's"
        " window), comma-separated; 'default' stands for AWS Node Termination Handler's,"
        " Karpenter's and GKE's (torchjob_operator.torchjob.nodes), '' for none",
    )
    p.add_argument(
        "--no-node-watch",
        action="store_true",
        help="do not watch Nodes (no RBAC for them): no termination notices, and a node that"
        " stops reporting is seen only once its pods are evicted",
    )


_POKES = frozenset({"Handler 'torchjob_event' succeeded.", "Handler 'torchtune_event' succeeded."})


def _not_a_poke(record: logging.LogRecord) -> bool:
    """False for kopf's line for each watch event its handlers hand to a job's loop."""
    return record.levelno != logging.INFO or record.getMessage() not in _POKES


def quiet_routine_lines() -> None:
    """At INFO, no line per routine request: the kubelet's liveness probe (two every 5 s, as
    many lines as everything else together in a fleet run) and kopf's "Handler ...
    succeeded" for each watch event (each poke of a job's loop, whose decisions are logged
    by the loop itself). ``--verbose`` keeps them."""
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(_not_a_poke)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not args.verbose:
        quiet_routine_lines()
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    # Our own identity, also given to kopf: kopf's default asks getpass.getuser(), which fails
    # for a uid without a passwd entry (the chart runs the image as 65532).
    identity = f"{socket.gethostname()}_{os.getpid()}"
    election = None
    if args.leader_elect:
        try:
            election = settings_mod.ElectionConfig(
                namespace=args.leader_election_namespace,
                name=args.leader_election_id,
                identity=identity,
                lease_duration_s=args.lease_duration,
                renew_deadline_s=args.renew_deadline,
                retry_period_s=args.retry_period,
            )
        except ValueError as e:
            print(f"torchjob-operator: {e}", file=sys.stderr)
            return 2
    try:
        notices = parse_notice_taints(args.notice_taints)
    except ValueError as e:
        print(f"torchjob-operator: --notice-taints: {e}", file=sys.stderr)
        return 2
    settings = settings_mod.OperatorSettings(
        namespaces=tuple(args.namespace),
        resync_period_s=args.resync_period,
        create_concurrency=args.create_concurrency,
        cache_deadline_s=args.cache_deadline,
        job_sweep_s=args.job_sweep,
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        leader_election=election,
        notice_taints=notices,
        watch_nodes=not args.no_node_watch,
    )
    from torchjob_operator.engine import memory

    memory.limit_arenas()  # before any thread starts (memory.py says why)
    if os.environ.get("TORCHJOB_TRACEMALLOC"):
        memory.trace_allocations(int(os.environ["TORCHJOB_TRACEMALLOC"]))
    if args.metrics_port:
        from torchjob_operator.engine import exposition

        exposition.serve(args.metrics_port)

    import kopf

    from torchjob_operator import handlers  # noqa: F401  (registers the handlers)
    from torchjob_operator.operator import Operator, load_kube_config

    load_kube_config()
    operator = Operator(settings)

    try:
        asyncio.run(
            kopf.operator(
                memo=kopf.Memo(operator=operator),  # what every handler is handed
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                standalone=True,  # leader election (--leader-elect), not kopf peering
                # kopf types this as its private NewType of str (not exported); a NewType is
                # the plain str at run time, so ours is passed as it is. mypy's
                # warn_unused_ignores flags this line if kopf ever types it as str.
                identity=identity,  # type: ignore[arg-type]
                liveness_endpoint=args.liveness,
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
