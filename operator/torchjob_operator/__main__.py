"""``python -m torchjob_operator`` / ``torchjob-operator``: run the operator against any kubeconfig."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from torchjob_operator import settings as settings_mod


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
    p.add_argument(
        "--resync-period", type=float, default=60.0, help="seconds between idle reconciles of a job"
    )
    p.add_argument("--create-concurrency", type=int, default=16, help="pods created in parallel")
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)"
    )
    p.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8081/healthz"
    )
    p.add_argument("--peering", default=None, help="kopf peering name for HA (default: standalone)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    settings_mod.SETTINGS = settings_mod.OperatorSettings(
        namespaces=tuple(args.namespace),
        resync_period_s=args.resync_period,
        create_concurrency=args.create_concurrency,
        metrics_port=args.metrics_port,
        liveness_endpoint=args.liveness,
    )
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)

    import kopf

    from torchjob_operator import handlers  # noqa: F401  (registers the handlers)

    try:
        asyncio.run(
            kopf.operator(
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                standalone=args.peering is None,
                peering_name=args.peering,
                liveness_endpoint=args.liveness,
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
