"""The ``torchjob`` command: run a TorchJob manifest locally, or manage TorchJobs on a cluster.

``torchjob run -f job.yaml`` needs no cluster: it runs the manifest's pods as
local processes (:func:`torchjob.client.run_local`). ``submit``, ``get``,
``logs``, ``scale`` and ``delete`` go through :class:`torchjob.client.TorchJobClient`.
Exit codes: 0 success; the failed pod's exit code for ``run``; 1 for an API
or credentials error; 2 for a bad command line or manifest.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from torchjob.cli.common import EXIT_API_ERROR, EXIT_USAGE, client_group, err
from torchjob.cli.common import client as _client
from torchjob.cli.tune import add_tune
from torchjob.client.errors import TorchJobClientError, TorchJobInvalid
from torchjob.client.manifest import ManifestError, check_manifest, load_manifest, read_documents
from torchjob.client.runtimes import with_runtime


def _default_max_restarts() -> int:
    """``spec.failurePolicy.maxRestarts`` when a manifest leaves it out (the API model's default)."""
    from torchjob.api.models import FailurePolicy

    return int(FailurePolicy().max_restarts)


def cmd_run(args: argparse.Namespace) -> int:
    from torchjob.client.local import run_local

    manifest = load_manifest(args.filename)
    result = run_local(
        manifest,
        max_restarts=args.max_restarts,
        grace_period_s=args.grace_period,
    )
    return result.exit_code


def cmd_submit(args: argparse.Namespace) -> int:
    docs = read_documents(args.filename)
    for source, doc in docs:  # a bad manifest is reported before credentials are looked for
        spec = doc.get("spec") if isinstance(doc, dict) else None
        if args.runtime is None and not (isinstance(spec, dict) and spec.get("runtimeRef")):
            check_manifest(doc, source)
    client = _client(args)
    for source, doc in docs:
        if isinstance(doc, dict):
            try:
                doc = with_runtime(doc, args.runtime)
            except ValueError as e:
                raise ManifestError(source, "--runtime", str(e)) from e
        # A job with a blueprint is checked merged over it (read from the cluster).
        m = check_manifest(
            doc, source, lambda ref, ns: client.get_runtime(ref, args.namespace or ns)
        )
        try:
            created = client.create(m, namespace=args.namespace)
        except TorchJobInvalid as e:  # rejected by the server's validation: a bad manifest
            raise ManifestError(m.source, e.field or "<document>", e.problem) from e
        meta = created.get("metadata", {})
        print(
            f"torchjob.{client_group()}/{meta.get('name')} created in namespace {meta.get('namespace')}"
        )
        if args.wait:
            job = client.wait_for_phase(
                meta["name"], args.wait, namespace=meta.get("namespace"), timeout_s=args.timeout
            )
            print(f"{meta['name']}: {job.get('status', {}).get('phase')}")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.output in ("json", "yaml"):
        objs = [client.get(args.job)] if args.job else client.list()
        data: Any = objs[0] if args.job else {"apiVersion": "v1", "kind": "List", "items": objs}
        if args.output == "json":
            print(json.dumps(data, indent=2, sort_keys=True))
        else:
            import yaml

            print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    return _print_table(
        client.table(args.job), f"No TorchJobs found in {client.namespace} namespace."
    )


def cmd_history(args: argparse.Namespace) -> int:
    from torchjob.client.table import history_table

    return _print_table(
        history_table(_client(args).get(args.job)), f"{args.job} has no history yet."
    )


def cmd_describe(args: argparse.Namespace) -> int:
    from torchjob.client.describe import job_events, sections

    client = _client(args)
    obj = client.get(args.job)
    for title, part in sections(obj, job_events(client, args.job)):
        if title:
            print(f"\n{title}:")
        if isinstance(part, list):
            print("\n".join(part))
        else:
            _print_table(part, "  <none>", to=sys.stdout)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import time

    from torchjob.client.dashboard import serve

    server = serve(
        _client(args), host=args.listen, port=args.port, all_namespaces=args.all_namespaces
    )
    url = f"http://{args.listen}:{server.server_port}/"
    print(f"torchjob dashboard on {url} (read-only; Ctrl-C to stop)", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(url)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _print_table(table: Any, empty: str, to: Any = None) -> int:
    """Print ``table``, or the line ``empty`` (to ``to``, stderr by default) when it has no
    row."""
    if not table.rows:
        (to or sys.stderr).write(empty + "\n")
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD if sys.stdout.isatty() else None, pad_edge=False, show_edge=False)
    for col in table.columns:
        t.add_column(col, no_wrap=True)
    for row in table.rows:
        t.add_row(*row)
    width = sum(
        max([len(c), *(len(r[i]) for r in table.rows)]) + 3 for i, c in enumerate(table.columns)
    )
    Console(width=max(80, width), soft_wrap=True).print(t)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    color = sys.stdout.isatty()
    colors = ("36", "33", "35", "32", "34", "31")
    try:
        for line in client.logs(args.job, follow=args.follow, container=args.container):
            prefix = f"[rank {line.pod_index}]"
            if color:
                prefix = f"\x1b[{colors[line.pod_index % len(colors)]}m{prefix}\x1b[0m"
            sys.stdout.write(f"{prefix} {line.text}\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    client = _client(args)
    client.delete(args.job)
    print(f"torchjob.{client_group()}/{args.job} deleted")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    client = _client(args)
    client.scale(args.job, args.replicas)
    print(f"torchjob.{client_group()}/{args.job} scaled to {args.replicas}")
    return 0


def cmd_initialize(args: argparse.Namespace) -> int:
    from torchjob.cli.initialize import run
    from torchjob.rules.initializer import SOURCE_ROOT

    return run(args.uri, args.target, args.source_root or SOURCE_ROOT)


def build_parser(prog: str = "torchjob") -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig", help="path to a kubeconfig (default: $KUBECONFIG or ~/.kube/config)"
    )
    common.add_argument("--context", help="kubeconfig context to use")
    common.add_argument(
        "-n", "--namespace", help="namespace (default: the context's, else 'default')"
    )

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run TorchJobs locally or manage them on a Kubernetes cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_run(sub)
    _add_cluster_commands(sub, common)
    _add_inspect_commands(sub, common)
    _add_initialize(sub)
    add_tune(sub, common)
    return parser


Subparsers = Any
"""``argparse``'s subparsers action (its class is private)."""


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser(
        "run",
        help="run a TorchJob manifest as local processes (no cluster needed)",
        description="Run spec.replicas local 'pods', each running the template's first container "
        "command with the same environment contract the operator gives pods.",
    )
    run.add_argument("-f", "--filename", required=True, help="TorchJob YAML file")
    run.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help="group restarts after a failure (default: spec.failurePolicy.maxRestarts, which "
        f"defaults to {_default_max_restarts()} when the manifest has no failurePolicy)",
    )
    run.add_argument(
        "--grace-period",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL (default 10)",
    )
    run.set_defaults(func=cmd_run)


def _add_cluster_commands(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """submit, get, logs, delete, scale: TorchJobs on the cluster."""
    submit = sub.add_parser(
        "submit", parents=[common], help="create the TorchJob(s) of a YAML file on the cluster"
    )
    submit.add_argument("-f", "--filename", required=True, help="TorchJob YAML file")
    submit.add_argument(
        "--runtime",
        metavar="NAME",
        help=(
            "the runtime blueprint the job starts from (sets spec.runtimeRef): NAME (a "
            "ClusterTorchRuntime) or TorchRuntime/NAME (one of the job's namespace)"
        ),
    )
    submit.add_argument(
        "--wait", metavar="PHASE", help="then wait for this phase (e.g. Running, Succeeded)"
    )
    submit.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to --wait (default 600)"
    )
    submit.set_defaults(func=cmd_submit)

    get = sub.add_parser(
        "get", parents=[common], help="list TorchJobs, or show one (like kubectl get tj)"
    )
    get.add_argument("job", nargs="?", help="TorchJob name (default: all in the namespace)")
    get.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    get.set_defaults(func=cmd_get)

    describe = sub.add_parser(
        "describe",
        parents=[common],
        help="a TorchJob's state, conditions, generations and latest Events",
    )
    describe.add_argument("job", help="TorchJob name")
    describe.set_defaults(func=cmd_describe)

    delete = sub.add_parser("delete", parents=[common], help="delete a TorchJob and its pods")
    delete.add_argument("job", help="TorchJob name")
    delete.set_defaults(func=cmd_delete)

    scale = sub.add_parser("scale", parents=[common], help="set spec.replicas (scale subresource)")
    scale.add_argument("job", help="TorchJob name")
    scale.add_argument("--replicas", type=int, required=True)
    scale.set_defaults(func=cmd_scale)


def _add_inspect_commands(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """dashboard, describe, history, logs: what a job went through."""
    dash = sub.add_parser(
        "dashboard",
        parents=[common],
        help="a local read-only web page of the jobs and studies (through your kubeconfig)",
    )
    dash.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    dash.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any)")
    dash.add_argument(
        "--listen", default="127.0.0.1", help="address (default 127.0.0.1: this machine only)"
    )
    dash.add_argument("--no-browser", action="store_true", help="do not open a browser")
    dash.set_defaults(func=cmd_dashboard)

    history = sub.add_parser(
        "history",
        parents=[common],
        help="a TorchJob's generations: why each began, who left and joined, what it cost",
    )
    history.add_argument("job", help="TorchJob name")
    history.set_defaults(func=cmd_history)

    logs = sub.add_parser(
        "logs", parents=[common], help="print all workers' logs, prefixed by rank"
    )
    logs.add_argument("job", help="TorchJob name")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="stream, following restarted pods, until the job ends",
    )
    logs.add_argument(
        "-c", "--container", help="container name (default: the pod's only container)"
    )
    logs.set_defaults(func=cmd_logs)


def _add_initialize(sub: Subparsers) -> None:
    init = sub.add_parser(
        "initialize",
        help="fetch a dataset or model once into a directory (what spec.initializers runs)",
        description="Fetch s3://bucket/key-or-prefix, hf://org/repo[@revision] or "
        "pvc://claim/path into TARGET once; a marker makes a second run a no-op.",
    )
    init.add_argument("--uri", required=True, help="s3://..., hf://... or pvc://...")
    init.add_argument("--target", required=True, help="directory to fetch into")
    init.add_argument(
        "--source-root", default=None, help="where a pvc:// claim is mounted (default: the pod's)"
    )
    init.set_defaults(func=cmd_initialize)


def kubectl_main() -> int:
    """``kubectl torchjob ...``: kubectl finds ``kubectl-torchjob`` on the PATH (this console
    script, or the krew plugin that hack/kubectl-plugin.sh builds around it) and passes it the
    rest of the command line; the same commands as ``torchjob``."""
    return main(None, prog="kubectl torchjob")


def main(argv: Sequence[str] | None = None, prog: str = "torchjob") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        rc: int = args.func(args)
    except ManifestError as e:
        err(str(e))
        return EXIT_USAGE
    except TorchJobClientError as e:
        err(str(e))
        return EXIT_API_ERROR
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
