"""The environment contract between the operator and the in-pod runtime.

The operator writes these variables into every worker pod; the runtime
(``torchjob.launch`` and ``torchjob.train``) reads them back. Both sides import
this one module, so a name can never drift between them. It imports nothing
heavier than the standard library: the operator image has no torch.

Two families of variables exist:

* ``TORCHJOB_*``: what torchjob itself needs (job identity, pod index,
  generation, elastic bounds, rendezvous endpoint, checkpoint location).
* The standard torch/torchrun variables (``MASTER_ADDR``, ``WORLD_SIZE``,
  ``RANK``, ``PET_*`` ...), so that an unchanged ``torchrun`` script or a plain
  ``torch.distributed.init_process_group("env://")`` works in *static* mode.

In a pod, ``RANK`` is the **node rank** (the pod's rank among pods), and
``WORLD_SIZE`` is the total number of training processes
(``pods x nproc_per_node``), the way torchrun's ``--node_rank`` and the
Kubeflow convention define them. The per-process ``RANK``/``LOCAL_RANK`` are
set by the agent (``torchjob.launch``) for each worker process it starts.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

# A pod's role in a published generation (member or standby) lives in torchjob.role;
# pod_role and pod_as_of below apply it to a pod's env.
from torchjob.role import Member as Member
from torchjob.role import Published as Published
from torchjob.role import Role as Role
from torchjob.role import Standby as Standby
from torchjob.role import rank_among as rank_among
from torchjob.role import ranked as ranked
from torchjob.role import role_in as role_in

# The termination message (the runtime's failure summary, read by the operator), the stop exit
# code (a worker that stopped as asked) and the OOM killer's evidence are part of the contract
# too; they live in torchjob.termination and are reachable from here.
from torchjob.termination import STOPPED_EXIT_CODE as STOPPED_EXIT_CODE
from torchjob.termination import TERMINATION_MESSAGE_LIMIT as TERMINATION_MESSAGE_LIMIT
from torchjob.termination import TerminationSummary as TerminationSummary
from torchjob.termination import oom_kills as oom_kills
from torchjob.termination import oom_since as oom_since
from torchjob.termination import parse_termination_message as parse_termination_message
from torchjob.termination import termination_message as termination_message

# --- torchjob's own variables -------------------------------------------------
JOB_NAME: Final = "TORCHJOB_JOB_NAME"
NAMESPACE: Final = "TORCHJOB_NAMESPACE"
POD_INDEX: Final = "TORCHJOB_POD_INDEX"
"""Index of this pod among the job's workers (0-based, dense within a generation)."""
REPLICAS: Final = "TORCHJOB_REPLICAS"
"""Number of worker pods in the current generation."""
NPROC_PER_NODE: Final = "TORCHJOB_NPROC_PER_NODE"
GENERATION: Final = "TORCHJOB_GENERATION"
"""Membership generation this pod was created for (restart count in static mode)."""
RDZV_HOST: Final = "TORCHJOB_RDZV_HOST"
RDZV_PORT: Final = "TORCHJOB_RDZV_PORT"
BACKEND: Final = "TORCHJOB_BACKEND"
"""``spec.backend``: ``auto``, ``nccl`` or ``gloo``; ``TorchTrainer`` in a pod forms its group with it."""
CHECKPOINT_PATH: Final = "TORCHJOB_CHECKPOINT_PATH"
"""fsspec URL or local path where rank 0 writes checkpoints ("" when none)."""
MEMBERSHIP: Final = "TORCHJOB_MEMBERSHIP"
DRAIN_S: Final = "TORCHJOB_DRAIN_S"  # seconds a pod given notice trains on (torchjob.rules.drain)
"""``spec.membershipPolicy``: ``RecreateGroup``, or ``KeepSurvivors`` (the runtime then follows
the job's ``status.currentGeneration`` instead of exiting when the group breaks)."""
KEEP_SURVIVORS: Final = "KeepSurvivors"
POD_NAME: Final = "TORCHJOB_POD_NAME"
SERVICE_NAME: Final = "TORCHJOB_SERVICE"
SERVICEACCOUNT_DIR: Final = "TORCHJOB_SERVICEACCOUNT_DIR"
"""Where the pod's ServiceAccount token lives (default: the kubelet's standard mount)."""
TERMINATION_LOG: Final = "TORCHJOB_TERMINATION_LOG"
"""The container's ``terminationMessagePath``: the runtime writes its failure summary there."""
TUNE_CONFIG: Final = "TORCHJOB_TUNE_CONFIG"
"""A tuning trial's config (JSON), set by ``torchjob.tune``'s cluster backend; a
``TorchTrainer`` in the pod merges it into its ``train_loop_config``."""
TUNE_TRIAL: Final = "TORCHJOB_TUNE_TRIAL"
"""The trial id of a tuning trial's TorchJob."""
DATASET_PATH: Final = "TORCHJOB_DATASET_PATH"  # where spec.initializers put the dataset,
MODEL_PATH: Final = "TORCHJOB_MODEL_PATH"  # and the model (each set only when the job has it)
TOPOLOGY: Final = "TORCHJOB_TOPOLOGY"
"""The pod's topology domain as JSON, ``{"<node label>": "<value>", ...}``, for a job admitted
with ``spec.placement`` through Kueue (``topology_of``); absent otherwise."""
MLFLOW_AUTOLOG: Final = "TORCHJOB_MLFLOW_AUTOLOG"
"""``false`` turns off the MLflow logging that ``MLFLOW_TRACKING_URI`` in a pod's env turns on
(rank 0's driver logs every report and checkpoint URI: ``torchjob.train.tracking``)."""

# --- standard torch / torchrun variables ---------------------------------------
MASTER_ADDR: Final = "MASTER_ADDR"
MASTER_PORT: Final = "MASTER_PORT"
WORLD_SIZE: Final = "WORLD_SIZE"
RANK: Final = "RANK"
LOCAL_RANK: Final = "LOCAL_RANK"
LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"
GROUP_RANK: Final = "GROUP_RANK"
NODE_RANK: Final = "NODE_RANK"
TORCHELASTIC_RESTART_COUNT: Final = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_RUN_ID: Final = "TORCHELASTIC_RUN_ID"
PET_NNODES: Final = "PET_NNODES"
PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
PET_NODE_RANK: Final = "PET_NODE_RANK"
PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
PET_MASTER_PORT: Final = "PET_MASTER_PORT"
PET_RDZV_ID: Final = "PET_RDZV_ID"
PYTHONUNBUFFERED: Final = "PYTHONUNBUFFERED"

DEFAULT_RDZV_PORT: Final = 29500  # the generation's TCPStore on its rank-0 pod (torch's default)
JOINER_READY_FILE: Final = "/tmp/torchjob-joiner-ready"
"""Written by a joiner's runtime once it waits for its generation (its interpreter has imported
the training script), for a readiness probe a user writes against it; the operator's probe
connects to ``JOINER_READY_PORT``. An elastic job grows back only to ready joiners."""
JOINER_READY_PORT: Final = 29499
"""Listened on by a joiner's runtime from the moment it writes ``JOINER_READY_FILE``: the
``tcpSocket`` readiness probe the operator gives joiner pods (``torchjob.train.ready``)."""
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
"""The kubelet's default ``terminationMessagePath``."""

# --- labels and annotations on objects the operator creates ---------------------
GROUP: Final = "torchjob.io"
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_POD_INDEX: Final = f"{GROUP}/pod-index"
LABEL_GENERATION: Final = f"{GROUP}/generation"
LABEL_JOINER: Final = f"{GROUP}/joiner"
"""On pods created ahead of the generation that takes them in (an elastic job's replacements
and warm standbys): "true". Such a pod is kept while it waits, not judged as stale."""
ROLE_WORKER: Final = "worker"
ROLE_PROBE: Final = "probe"
"""Placeholder pods that test for free capacity before an elastic job grows."""
ROLE_INITIALIZER: Final = "initializer"
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
WORKER_SUFFIX: Final = "-worker-"
"""Between a job's name and a worker's index in the pod's name and hostname (worker_pod_name)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it): a local rendezvous port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def worker_pod_name(job: str, index: int) -> str:
    """Name of worker ``index`` of job ``job``: ``<job>-worker-<index>``."""
    return f"{job}-worker-{index}"


def probe_pod_name(job: str, index: int) -> str:
    return f"{job}-probe-{index}"


def worker_service_account(job: str) -> str:
    """The per-job ServiceAccount: may get and patch this job's status, nothing else."""
    return f"{job}-worker"


def worker_hostname(job: str, index: int, namespace: str) -> str:
    """Stable DNS name of a worker through the job's headless Service."""
    return f"{worker_pod_name(job, index)}.{job}.{namespace}.svc"


@dataclass(frozen=True)
class PodEnv:
    """What the operator tells one worker pod. Built by the operator, parsed by the runtime."""

    job_name: str
    namespace: str
    pod_index: int
    replicas: int
    nproc_per_node: int
    generation: int
    rdzv_host: str
    rdzv_port: int = DEFAULT_RDZV_PORT
    backend: str = "auto"
    checkpoint_path: str = ""
    membership: str = "RecreateGroup"
    node_rank: int | None = None
    """This pod's rank among the generation's pods when it is not ``pod_index`` (KeepSurvivors:
    ``status.members`` puts survivors first, so a generation that lost pod 0 has another
    rank 0 and its rendezvous on that pod)."""
    drain_s: int = 0
    """Seconds this pod's workers train on after SIGTERM while the operator starts its
    replacement (``torchjob.rules.drain``); 0: stop at the next report."""

    @property
    def group_rank(self) -> int:
        """The pod's rank among pods (torchrun's node rank): its ranks start at this x nproc."""
        return self.pod_index if self.node_rank is None else self.node_rank

    @property
    def keeps_survivors(self) -> bool:
        """The operator keeps this pod across generations; the runtime must follow them."""
        return self.membership == KEEP_SURVIVORS

    @property
    def world_size(self) -> int:
        """Total training processes in the group: pods x processes per pod."""
        return self.replicas * self.nproc_per_node

    @property
    def run_id(self) -> str:
        return f"{self.namespace}.{self.job_name}"

    def to_env(self) -> dict[str, str]:
        """All variables, torchjob's and torch's, as a pod's ``env`` would carry them."""
        return {
            JOB_NAME: self.job_name,
            NAMESPACE: self.namespace,
            POD_INDEX: str(self.pod_index),
            REPLICAS: str(self.replicas),
            NPROC_PER_NODE: str(self.nproc_per_node),
            GENERATION: str(self.generation),
            RDZV_HOST: self.rdzv_host,
            RDZV_PORT: str(self.rdzv_port),
            BACKEND: self.backend,
            CHECKPOINT_PATH: self.checkpoint_path,
            MEMBERSHIP: self.membership,
            **({DRAIN_S: str(self.drain_s)} if self.drain_s else {}),
            # torch / torchrun
            MASTER_ADDR: self.rdzv_host,
            MASTER_PORT: str(self.rdzv_port),
            WORLD_SIZE: str(self.world_size),
            RANK: str(self.group_rank),
            NODE_RANK: str(self.group_rank),
            GROUP_RANK: str(self.group_rank),
            LOCAL_WORLD_SIZE: str(self.nproc_per_node),
            TORCHELASTIC_RESTART_COUNT: str(self.generation),
            TORCHELASTIC_RUN_ID: self.run_id,
            PET_NNODES: str(self.replicas),
            PET_NPROC_PER_NODE: str(self.nproc_per_node),
            PET_NODE_RANK: str(self.group_rank),
            PET_MASTER_ADDR: self.rdzv_host,
            PET_MASTER_PORT: str(self.rdzv_port),
            PET_RDZV_ID: self.run_id,
            PYTHONUNBUFFERED: "1",
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PodEnv | None:
        """Parse the contract from ``environ``; ``None`` when not inside a TorchJob pod.

        Raises ``ValueError`` naming the variable when one is present but malformed.
        """
        env = os.environ if environ is None else environ
        if JOB_NAME not in env:
            return None

        def integer(name: str, default: int | None = None) -> int:
            raw = env.get(name)
            if raw is None or raw == "":
                if default is None:
                    raise ValueError(
                        f"environment variable {name} is required inside a TorchJob pod"
                    )
                return default
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None

        replicas = integer(REPLICAS)
        pod_index = integer(POD_INDEX)
        node_rank = integer(NODE_RANK, pod_index)
        return cls(
            job_name=env[JOB_NAME],
            namespace=env.get(NAMESPACE, "default"),
            pod_index=pod_index,
            replicas=replicas,
            nproc_per_node=integer(NPROC_PER_NODE, 1),
            generation=integer(GENERATION, 0),
            rdzv_host=env.get(RDZV_HOST) or env.get(MASTER_ADDR, "127.0.0.1"),
            rdzv_port=integer(RDZV_PORT, DEFAULT_RDZV_PORT),
            backend=env.get(BACKEND, "auto"),
            checkpoint_path=env.get(CHECKPOINT_PATH, ""),
            membership=env.get(MEMBERSHIP) or "RecreateGroup",
            node_rank=None if node_rank == pod_index else node_rank,
            drain_s=integer(DRAIN_S, 0),
        )


def topology_env(domain: Mapping[str, str]) -> str:
    """The value of ``TORCHJOB_TOPOLOGY`` for a domain."""
    return json.dumps(dict(sorted(domain.items())), separators=(",", ":"))


def topology_of(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This pod's domain, level by level (``{}`` when the job has none): a script builds its
    device mesh along it. Raises ``ValueError`` naming the variable when it is malformed."""
    raw = (os.environ if environ is None else environ).get(TOPOLOGY) or "{}"
    try:
        domain = json.loads(raw)
    except ValueError:
        domain = None
    if not isinstance(domain, dict) or not all(isinstance(v, str) for v in domain.values()):
        raise ValueError(f"environment variable {TOPOLOGY}={raw!r} is not a JSON object of labels")
    return domain


# --- a pod's role now: its env and the generation the job's status publishes -------------
def _deciding(pod: PodEnv, published: Published | None) -> Published | None:
    """The published generation where it, not the pod's env, says the pod's place; None
    while the status publishes no generation yet, or publishes the one the env was written
    for with no rank order of its own (then the env, written from the same plan, says).
    An env that gives the pod another rank than its index (``NODE_RANK``) was not written
    from a plan in index order: a joiner created for generation g+1 of a grow, when a restart
    published its own g+1 (a hard loss of the last survivor) in index order; there the
    status says."""
    if published is None or (
        published.members is None
        and published.generation == pod.generation
        and pod.node_rank is None
    ):
        return None
    return published


def pod_role(pod: PodEnv, published: Published | None = None) -> Role:
    """This pod's role now. ``published`` is the generation the job's status names (None
    while it names none, or where the pod cannot read it). Where the env says (see
    ``_deciding``), the pod is a member when its rank among pods (``NODE_RANK``, default its
    index) is one of the generation's ``REPLICAS``: a standby's index is beyond them."""
    deciding = _deciding(pod, published)
    if deciding is not None:
        return role_in(deciding, pod.pod_index)
    if 0 <= pod.group_rank < pod.replicas:
        return Member(pod.generation, pod.group_rank, pod.replicas)
    return Standby(pod.generation)


def pod_as_of(pod: PodEnv, published: Published | None = None) -> PodEnv:
    """``pod``'s env as of the published generation: its own where the env says (see
    ``_deciding``); else with that generation's number and size, the pod's place in
    :func:`ranked` as its rank among pods, and a rendezvous host that names a worker of the
    job (the operator's default) moved to the first member."""
    deciding = _deciding(pod, published)
    if deciding is None:
        return pod
    order = ranked(deciding)
    rank = rank_among(order, pod.pod_index)
    host = pod.rdzv_host
    prefix, suffix = f"{pod.job_name}-worker-", f".{pod.job_name}.{pod.namespace}.svc"
    if order and host.startswith(prefix) and host.endswith(suffix):
        host = worker_hostname(pod.job_name, order[0], pod.namespace)
    return replace(
        pod,
        generation=deciding.generation,
        replicas=len(order),
        node_rank=None if rank is None or rank == pod.pod_index else rank,
        rdzv_host=host,
    )
