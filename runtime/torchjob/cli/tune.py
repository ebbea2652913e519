"""``torchjob tune``: TorchTune studies on the cluster (submit, get, logs, delete)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchjob.cli.common import client as _client
from torchjob.cli.common import client_group, err
from torchjob.client.errors import TorchJobInvalid
from torchjob.client.manifest import ManifestError

Subparsers = Any
"""``argparse``'s subparsers action (its class is private)."""


def _tune_client(args: argparse.Namespace) -> Any:
    from torchjob.client.studies import TuneClient

    return TuneClient(_client(args))


def cmd_tune_submit(args: argparse.Namespace) -> int:
    import yaml

    from torchjob.client.studies import validate_study

    with open(args.filename) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:  # all of them before anything is sent
        try:
            validate_study(doc)
        except TorchJobInvalid as e:
            raise ManifestError(args.filename, e.field or "<document>", e.problem) from e
    client = _tune_client(args)
    for doc in docs:
        created = client.create(doc, namespace=args.namespace)
        meta = created.get("metadata", {})
        print(
            f"torchtune.{client_group()}/{meta.get('name')} created in namespace {meta.get('namespace')}"
        )
        if args.wait:
            done = client.wait(
                meta["name"], namespace=meta.get("namespace"), timeout_s=args.timeout
            )
            print(f"{meta['name']}: {(done.get('status') or {}).get('phase')}")
    return 0


def cmd_tune_get(args: argparse.Namespace) -> int:
    from torchjob.client.studies import summary_rows

    client = _tune_client(args)
    objs = [client.get(args.study)] if args.study else client.list()
    if args.output in ("json", "yaml"):
        data: Any = objs[0] if args.study else {"apiVersion": "v1", "kind": "List", "items": objs}
        if args.output == "json":
            print(json.dumps(data, indent=2, sort_keys=True))
        else:
            import yaml

            print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    print(
        f"{'NAME':<24} {'PHASE':<10} {'TRIALS':<8} {'RUNNING':<8} {'PRUNED':<7} {'FAILED':<7} BEST"
    )
    for o in objs:
        st = o.get("status") or {}
        best = st.get("bestTrial") or {}
        shown = f"{best.get('value'):.6g} ({best.get('name')})" if best else ""
        print(
            f"{o['metadata']['name']:<24} {st.get('phase') or '':<10} {st.get('progress') or '':<8} "
            f"{st.get('trialsRunning') or 0:<8} {st.get('trialsPruned') or 0:<7} "
            f"{st.get('trialsFailed') or 0:<7} {shown}"
        )
    if args.study:
        print(f"\n{'TRIAL':<6} {'TORCHJOB':<32} {'STATE':<10} {'VALUE':<12} {'STEP':<5} PARAMS")
        for row in summary_rows(objs[0]):
            print(f"{row[0]:<6} {row[1]:<32} {row[2]:<10} {row[3]:<12} {row[4]:<5} {row[5]}")
    return 0


def cmd_tune_logs(args: argparse.Namespace) -> int:
    """The logs of one trial (--trial N), else of the best trial, else of the latest one."""
    client = _tune_client(args)
    st = client.get(args.study).get("status") or {}
    trials = st.get("trials") or []
    if args.trial is not None:
        chosen = next((t for t in trials if t.get("number") == args.trial), None)
    else:
        chosen = st.get("bestTrial") or (trials[-1] if trials else None)
    if chosen is None:
        err(f"TorchTune {args.study}: no trial {'' if args.trial is None else args.trial} yet")
        return 1
    for line in client.jobs.logs(chosen["name"], follow=args.follow):
        sys.stdout.write(f"[{chosen['name']} rank {line.pod_index}] {line.text}\n")
    return 0


def cmd_tune_delete(args: argparse.Namespace) -> int:
    _tune_client(args).delete(args.study)
    print(f"torchtune.{client_group()}/{args.study} deleted (its trial TorchJobs go with it)")
    return 0


def add_tune(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    tune = sub.add_parser("tune", help="TorchTune studies: submit, get, logs, delete")
    tsub = tune.add_subparsers(dest="tune_command", required=True, metavar="COMMAND")
    t_submit = tsub.add_parser(
        "submit", parents=[common], help="create the TorchTune(s) of a YAML file"
    )
    t_submit.add_argument("-f", "--filename", required=True, help="TorchTune YAML file")
    t_submit.add_argument("--wait", action="store_true", help="then wait until it finishes")
    t_submit.add_argument("--timeout", type=float, default=None, help="seconds to --wait")
    t_submit.set_defaults(func=cmd_tune_submit)
    t_get = tsub.add_parser(
        "get", parents=[common], help="list studies, or show one with its trials"
    )
    t_get.add_argument("study", nargs="?", help="TorchTune name")
    t_get.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    t_get.set_defaults(func=cmd_tune_get)
    t_logs = tsub.add_parser("logs", parents=[common], help="logs of a trial (default: the best)")
    t_logs.add_argument("study", help="TorchTune name")
    t_logs.add_argument("--trial", type=int, help="trial number")
    t_logs.add_argument("-f", "--follow", action="store_true")
    t_logs.set_defaults(func=cmd_tune_logs)
    t_delete = tsub.add_parser("delete", parents=[common], help="delete a study and its trials")
    t_delete.add_argument("study", help="TorchTune name")
    t_delete.set_defaults(func=cmd_tune_delete)
