"""The env contract of one worker of a TorchJob: the one builder the operator's pods
(``torchjob_operator.resources.pods``) and ``torchjob run``'s local pods share.

It lives here, above ``torchjob.contract`` and ``torchjob.api``, because it reads the spec:
the contract names the variables and imports nothing of the API models.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.api.models import TorchJobSpec
from torchjob.contract import DEFAULT_RDZV_PORT, PodEnv, rank_among, worker_hostname


def worker_pod_env(
    spec: TorchJobSpec,
    *,
    job_name: str,
    namespace: str,
    index: int,
    generation: int,
    replicas: int,
    rdzv_host: str | None = None,
    rdzv_port: int = DEFAULT_RDZV_PORT,
    nproc_per_node: int | None = None,
    members: Sequence[int] | None = None,
    drain_s: int = 0,
) -> PodEnv:
    """What worker ``index`` of a TorchJob gets. ``members`` is the generation's rank order
    of pod indices (``status.members``; default ``0..replicas-1``): the pod's rank is its
    place in it, and the rendezvous host defaults to the DNS name of its first pod behind
    the headless Service."""
    first = members[0] if members else 0
    rank = rank_among(members, index) if members else None
    return PodEnv(
        job_name=job_name,
        namespace=namespace,
        pod_index=index,
        replicas=replicas,
        nproc_per_node=(
            spec.resolved_nproc_per_node() if nproc_per_node is None else nproc_per_node
        ),
        generation=generation,
        rdzv_host=rdzv_host or worker_hostname(job_name, first, namespace),
        rdzv_port=rdzv_port,
        backend=spec.backend.value,
        checkpoint_path=spec.checkpoint.location if spec.checkpoint else "",
        membership=spec.membership_policy.value,
        node_rank=None if rank is None or rank == index else rank,
        drain_s=drain_s,
    )
