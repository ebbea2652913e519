"""Where a worker group's ranks live: world size, this host's rank offset, the master endpoint.

Locally every rank is on 127.0.0.1 and the port is picked free. In a TorchJob pod
the operator's env contract (:class:`torchjob.contract.PodEnv`) says how many
processes this pod runs and which global ranks they get.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchjob.contract import PodEnv, free_port


@dataclass(frozen=True)
class Placement:
    """The ranks one host runs within the whole group."""

    world_size: int
    """Total training processes in the group, across hosts."""
    local_world_size: int
    """Processes on this host."""
    rank_offset: int = 0
    """Global rank of this host's local rank 0."""
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """0 means: pick a free port on start (local mode only)."""
    generation: int = 0
    run_id: str = "local"

    def __post_init__(self) -> None:
        if self.local_world_size < 1:
            raise ValueError(f"local_world_size must be >= 1, got {self.local_world_size}")
        if self.rank_offset < 0 or self.rank_offset + self.local_world_size > self.world_size:
            raise ValueError(
                f"ranks {self.rank_offset}..{self.rank_offset + self.local_world_size - 1} "
                f"do not fit in world_size {self.world_size}"
            )

    @classmethod
    def local(cls, num_workers: int, *, generation: int = 0) -> Placement:
        """All ranks on this machine."""
        return cls(world_size=num_workers, local_world_size=num_workers, generation=generation)

    @classmethod
    def from_pod_env(cls, pod: PodEnv) -> Placement:
        """This pod's share of the job: ``nproc_per_node`` ranks from ``group_rank * nproc``."""
        return cls(
            world_size=pod.world_size,
            local_world_size=pod.nproc_per_node,
            rank_offset=pod.group_rank * pod.nproc_per_node,
            node_rank=pod.group_rank,
            num_nodes=pod.replicas,
            master_addr=pod.rdzv_host,
            master_port=pod.rdzv_port,
            generation=pod.generation,
            run_id=pod.run_id,
        )

    def with_port(self) -> Placement:
        """This placement with a concrete master port."""
        if self.master_port:
            return self
        return Placement(
            world_size=self.world_size,
            local_world_size=self.local_world_size,
            rank_offset=self.rank_offset,
            node_rank=self.node_rank,
            num_nodes=self.num_nodes,
            master_addr=self.master_addr,
            master_port=free_port(self.master_addr),
            generation=self.generation,
            run_id=self.run_id,
        )


def available_workers(max_workers: int, use_gpu: bool) -> int:
    """Workers this machine can run now: one per visible GPU, or any number of CPU processes."""
    if not use_gpu:
        return max_workers
    import torch

    return min(max_workers, torch.cuda.device_count())
