"""The jobs of the goodput benchmark (bench/goodput.py): a TorchJob per policy running
bench/_goodput_worker.py (or the FSDP2 one) on the real node, and the Kubeflow PyTorchJob a
user would pick instead, under torchrun (bench/_goodput_torchrun.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tests.cluster.realnode import NODE_LABEL, TOLERATION, image

from bench.harness import REPO
from torchjob.api.models import GROUP, VERSION
from torchjob.launch import malloc

WORKER = REPO / "bench" / "_goodput_worker.py"
WORKERS = {"ddp": WORKER, "fsdp": REPO / "bench" / "_goodput_fsdp_worker.py"}
STRATEGIES = tuple(WORKERS)
TORCHRUN_WORKER = REPO / "bench" / "_goodput_torchrun.py"
KUBEFLOW = "Kubeflow"
POLICIES = ("RecreateGroup", "KeepSurvivors", "Elastic", "Standby", KUBEFLOW)
JOB = "gp"


def add_worker_env(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--worker-env",
        action="append",
        metavar="NAME=VALUE",
        help="an extra environment variable of torchjob's trainers (repeatable)",
    )


def worker_env(args: argparse.Namespace) -> list[dict[str, str]]:
    """``--worker-env NAME=VALUE`` (repeated): extra variables of torchjob's trainers (e.g.
    ``TORCHJOB_RESTORE_POINT_EVERY=100000``: the restore point's loop without its copies)."""
    pairs = [item.split("=", 1) for item in getattr(args, "worker_env", None) or []]
    return [{"name": name, "value": value} for name, value in pairs]


def restore_point_args(args: argparse.Namespace, rp: bool) -> list[str]:
    """The worker's ``--restore-point`` (and ``--in-place`` with it)."""
    return ["--restore-point", *(["--in-place"] if args.in_place else [])] if rp else []


def manifest(
    args: argparse.Namespace,
    policy: str,
    storage: Path,
    events: Path,
    strategy: str = "ddp",
    restore_point: bool | None = None,
) -> dict[str, Any]:
    """A row's TorchJob; ``restore_point`` overrides ``--restore-point``."""
    rp = args.restore_point if restore_point is None else restore_point
    spec: dict[str, Any] = {
        "replicas": args.replicas,
        "backend": "gloo",
        "membershipPolicy": "RecreateGroup" if policy == "RecreateGroup" else "KeepSurvivors",
        "checkpoint": {"path": str(storage)},
        "failurePolicy": {"maxRestarts": 1000, "backoff": {"initialSeconds": 1, "maxSeconds": 1}},
        "template": {
            "spec": {
                "nodeSelector": {NODE_LABEL: "true"},
                "tolerations": [TOLERATION],
                "terminationGracePeriodSeconds": args.grace,
                "containers": [
                    {
                        "name": "trainer",
                        "image": image("runtime-cpu"),
                        "imagePullPolicy": "Never",
                        "command": [
                            "python3",
                            str(WORKERS[strategy]),
                            str(events),
                            str(args.step_seconds),
                            str(args.ckpt_every),
                            str(10**9),
                            str(args.batch),
                            *restore_point_args(args, rp),
                            *state_args(args),
                        ],
                        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}, *worker_env(args)],
                        "resources": {
                            "requests": {"cpu": args.cpu_request, "memory": args.memory_request}
                        },
                        "volumeMounts": [
                            {"name": "bench", "mountPath": str(WORKER.parent), "readOnly": True},
                            {"name": "storage", "mountPath": str(storage.parent)},
                        ],
                    }
                ],
                "volumes": [
                    {
                        "name": "bench",
                        "hostPath": {"path": str(WORKER.parent), "type": "Directory"},
                    },
                    {
                        "name": "storage",
                        "hostPath": {"path": str(storage.parent), "type": "Directory"},
                    },
                ],
            }
        },
    }
    if policy == "Elastic":
        spec["elastic"] = {
            "minReplicas": args.min_replicas,
            "maxReplicas": args.replicas,
            "shrinkOnDisruption": args.shrink_on_disruption,
        }
    if policy == "Standby":
        # Warm standbys take a lost pod's place at once; without a ready one, go on smaller.
        spec["elastic"] = {
            "minReplicas": args.min_replicas,
            "maxReplicas": args.replicas,
            "standbyReplicas": args.standby,
            "shrinkOnDisruption": True,
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchJob",
        "metadata": {"name": JOB},
        "spec": spec,
    }


def state_args(args: argparse.Namespace) -> list[str]:
    """The worker's ``--state-mib N`` (``--state-mib``; none for the tiny default model)."""
    mib = getattr(args, "state_mib", 0)
    return ["--state-mib", str(mib)] if mib else []


KF_RDZV_PORT = 23456


def kubeflow_manifest(args: argparse.Namespace, storage: Path, events: Path) -> dict[str, Any]:
    """What a user would pick instead: Kubeflow's PyTorchJob v1.8.1, Workers only, with
    ``elasticPolicy`` (c10d rendezvous on worker-0, ``minReplicas = replicas - 1``) under
    torchrun, ``restartPolicy: OnFailure`` as Kubeflow's elastic example has it; the same
    node, image, grace period, steps and checkpoint cadence (bench/_goodput_torchrun.py), and
    the malloc thresholds torchjob's workers set (``torchjob.launch.malloc``) as glibc's own
    variables, which a Kubeflow user can set too: the rows compare failure handling, not
    allocators (without them the image's step is 2.75x slower, bench/malloc_tuning.py)."""
    torchjob_spec = manifest(args, "RecreateGroup", storage, events)["spec"]["template"]
    template = json.loads(json.dumps(torchjob_spec))
    container = template["spec"]["containers"][0]
    container["name"] = "pytorch"  # the container Kubeflow looks for
    container["command"] = [
        "python3",
        str(TORCHRUN_WORKER),
        "--torchrun",  # torchrun, with the one default this image's torch needs (see there)
        str(TORCHRUN_WORKER),
        *(a for a in container["command"][2:] if a not in ("--restore-point", "--in-place")),
    ]
    container["env"] = [
        *container["env"],
        {"name": "USE_LIBUV", "value": "0"},
        *({"name": k, "value": v} for k, v in malloc.glibc_env().items()),
    ]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": KF_RDZV_PORT}]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": JOB},
        "spec": {
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "minReplicas": args.min_replicas,
                "maxReplicas": args.replicas,
                "maxRestarts": 1000,
                "nProcPerNode": 1,
            },
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": args.replicas,
                    "restartPolicy": "OnFailure",
                    "template": template,
                }
            },
        },
    }
