"""``get_context()``: where this worker sits in the group (Ray Train's method names)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from torchjob.contract import DATASET_PATH, MODEL_PATH, PodEnv
from torchjob.train import _session


@dataclass(frozen=True)
class TrainContext:
    world_size: int
    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    generation: int
    run_path: str

    def get_world_size(self) -> int:
        return self.world_size

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_trial_name(self) -> str:
        return self.experiment_name

    def get_trial_dir(self) -> str:
        return self.run_path

    def get_generation(self) -> int:
        """Restart/rescale generation of the group (0 for the first)."""
        return self.generation

    def get_dataset_path(self) -> str | None:
        """Where the job's dataset initialiser put the dataset (``spec.initializers.dataset``,
        ``TORCHJOB_DATASET_PATH``); None when the job has none."""
        return os.environ.get(DATASET_PATH) or None

    def get_model_path(self) -> str | None:
        """Where the job's model initialiser put the model (``TORCHJOB_MODEL_PATH``); None
        when the job has none."""
        return os.environ.get(MODEL_PATH) or None


def get_context() -> TrainContext:
    """The current worker's context; outside ``train_func`` a single-process one."""
    s = _session.current()
    if s is None:
        return TrainContext(1, 0, 0, 1, 0, "", 0, "")
    return TrainContext(
        world_size=s.world_size,
        world_rank=s.world_rank,
        local_rank=s.local_rank,
        local_world_size=s.local_world_size,
        node_rank=s.node_rank,
        experiment_name=s.experiment_name,
        generation=s.generation,
        run_path=s.run_path,
    )


def is_primary() -> bool:
    """True where side effects belong: global rank 0 inside ``train_func``; after ``fit()``,
    the driver on a laptop or the pod of a TorchJob that ran rank 0 last (pod 0 unless a
    ``KeepSurvivors`` job moved rank 0, ``status.members``); before any ``fit()``, pod 0.
    Every pod's ``fit()`` returns the same ``Result``, so code after it runs everywhere:
    upload or print once with this."""
    s = _session.current()
    if s is not None:
        return s.world_rank == 0
    led = _session.fit_led()
    if led is not None:  # rank 0 may have moved to another pod (status.members)
        return led
    pod = PodEnv.from_env()
    return pod is None or pod.pod_index == 0
