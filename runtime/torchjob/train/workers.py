"""This pod's worker processes across ``fit``'s generations (``torchjob.train.controller``).

Each generation runs in a worker group placed by the pod's env contract (on a laptop: every
rank local). Under KeepSurvivors the processes outlive a generation: started unformed before
the first one (a joiner or standby imports torch while it waits), kept when the group stops
for a membership change, and re-formed in place for the next generation.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchjob import contract
from torchjob.contract import PodEnv
from torchjob.launch import LaunchError, Placement, WorkerGroup
from torchjob.launch.policy import RunState
from torchjob.launch.settings import ENV_RESTORE_POINT_DIR, SLOW_EXIT_S, RuntimeSettings
from torchjob.launch.startup import Abandon
from torchjob.train._spec import WorkerSpec
from torchjob.train.progress import ProgressView
from torchjob.train.recovery import shm_keep
from torchjob.train.steps import TrainerSettings

log = logging.getLogger(__name__)


def _timed_shutdown(group: WorkerGroup, timeout_s: float) -> None:
    """``group.shutdown``, said in the log when it was slow: a pod that stops is paid for
    until its processes are gone (a leaver beside its replacement)."""
    t0 = time.monotonic()
    killed = group.shutdown(timeout_s=timeout_s)
    took = time.monotonic() - t0
    if took > SLOW_EXIT_S or killed:
        print(
            f"[torchjob] the worker processes took {took:.1f}s to exit"
            + (f" ({killed} killed after {timeout_s:g}s)" if killed else ""),
            file=sys.stderr,
            flush=True,
        )


def backend(configured: str | None, pod: PodEnv | None) -> str:
    """The process-group backend: in a pod, the TorchJob's immutable ``spec.backend``
    (``TORCHJOB_BACKEND``) unless it is ``auto``; else ``TorchConfig.backend``, else auto."""
    wanted = pod.backend if pod is not None and pod.backend != "auto" else None
    if wanted and configured and configured != wanted:
        log.warning(
            "torchjob: TorchConfig(backend=%r) differs from the TorchJob's spec.backend %r; "
            "using spec.backend",
            configured,
            wanted,
        )
    return wanted or configured or "auto"


def worker_spec(
    trainer: TrainerSettings,
    name: str,
    run_url: str,
    *,
    share_result: bool,
    history: Sequence[dict[str, Any]],
    env: Mapping[str, str] | None = None,
) -> WorkerSpec:
    """What every worker of a generation runs: the training function and where it keeps
    its checkpoints, and the reports of the generations before."""
    cc = trainer.run_config.checkpoint_config
    resume = trainer.resume_from_checkpoint
    return WorkerSpec(
        train_func=trainer.train_loop_per_worker,
        config=trainer.train_loop_config,
        storage_url=run_url,
        experiment_name=name,
        run_path=run_url,
        num_to_keep=cc.num_to_keep,
        score_attribute=cc.checkpoint_score_attribute,
        score_order=cc.checkpoint_score_order,
        resume_from=resume._url if resume is not None else None,
        share_result=share_result,
        history_before=tuple(history),
        async_commit=cc.async_commit,
        env=dict(env or {}),
    )


def placement(pod: PodEnv | None, state: RunState) -> tuple[Placement, dict[str, str]]:
    """Where a generation's local workers go, and the env they get besides torchrun's: on a
    laptop every rank of ``state``; in a pod (as of the generation: a member) its share."""
    if pod is None:
        return Placement.local(state.num_workers, generation=state.generation), {}
    env = {contract.GENERATION: str(pod.generation), contract.REPLICAS: str(pod.replicas)}
    return Placement.from_pod_env(pod), env


def unformed(pod: PodEnv, generation: int) -> Placement:
    """A standby's processes: no rank in the generation, so any placement of their number
    will do until a generation names the pod (they start unformed)."""
    return Placement.local(pod.nproc_per_node, generation=generation)


class Workers:
    """The worker groups of one ``fit``, and the processes kept between generations."""

    def __init__(self, trainer: TrainerSettings, *, heals: bool = False) -> None:
        self.t = trainer
        self.heals = heals
        """On a laptop: the survivors of a lost rank are kept, the lost processes replaced
        (or the group shrunk) and the group re-formed in place (``WorkerGroup.heal``)."""
        self._kept: WorkerGroup | None = None
        """KeepSurvivors: this pod's worker processes between generations (on a laptop: the
        survivors)."""
        self.shm_dir: Path | None = None
        """Where this fit's restore points outlive its worker processes (``shm_keep``),
        made with its first group."""
        self._shm_tried = False

    def _new_group(
        self, placement: Placement, env: dict[str, str], pod: PodEnv | None
    ) -> WorkerGroup:
        tc = self.t.torch_config
        if not self._shm_tried:
            self._shm_tried = True
            if RuntimeSettings.from_env().restore_point_shm:
                self.shm_dir = shm_keep.make_dir()
        return WorkerGroup(
            placement.local_world_size,
            backend=backend(tc.backend, pod),
            use_gpu=self.t.scaling_config.use_gpu,
            timeout_s=tc.timeout_s,
            placement=placement,
            env={**env, ENV_RESTORE_POINT_DIR: str(self.shm_dir)} if self.shm_dir else env,
        )

    def prestart(
        self, placement: Placement, env: dict[str, str], pod: PodEnv | None, view: ProgressView
    ) -> None:
        """KeepSurvivors: start this pod's worker processes unformed, before its first
        generation, so that they import torch while the pod waits (a joiner waits for the
        job to grow); every generation then forms its group in these same processes."""
        group = self._new_group(placement, env, pod)
        started = time.monotonic()
        try:
            group.start(form=False)
        except LaunchError as err:
            view.message(f"[torchjob] could not start the workers ahead: {err}")
            return
        view.message(
            f"[torchjob] {placement.local_world_size} worker process(es) started ahead in "
            f"{time.monotonic() - started:.1f}s ({group.start_why})"
        )
        self._kept = group

    def take(
        self,
        placement: Placement,
        env: dict[str, str],
        pod: PodEnv | None,
        abandon: Abandon | None = None,
    ) -> WorkerGroup:
        """The workers for this generation: the kept processes, re-formed in place when they
        fit ``placement``, else a new group (both ready to run). ``abandon``: asked while they
        form (``torchjob.launch.startup.await_ready``); a formation given up on raises
        ``WorkerGroupStartError`` and its processes are shut down."""
        kept, self._kept = self._kept, None
        n = placement.local_world_size
        if kept is not None and (
            kept.can_reform(placement) or (self._heals(kept) and kept.heals_to(n))
        ):
            kept.abandon = abandon
            try:
                if not kept.can_reform(placement):
                    kept.heal(n)
                kept.reform(placement, env)
                return kept
            except LaunchError:
                kept.shutdown(timeout_s=0)
                raise
        if kept is not None:
            kept.shutdown(timeout_s=0)
        group = self._new_group(placement, env, pod)
        group.abandon = abandon
        try:
            group.start()
        except LaunchError:
            group.shutdown(timeout_s=0)
            raise
        return group

    def _heals(self, group: WorkerGroup) -> bool:
        return self.heals and group.survivable()

    def settle(
        self, group: WorkerGroup, placement: Placement, *, keep: bool, timeout_s: float
    ) -> bool:
        """After a generation that did not complete: keep ``group``'s processes for the next
        one when ``keep`` (KeepSurvivors, no stop requested; on a laptop, survivors) and
        they can re-form; else shut them down within ``timeout_s``. True if kept."""
        if keep and (group.can_reform(placement) or self._heals(group)):
            self._kept = group
            return True
        _timed_shutdown(group, timeout_s)
        return False

    def release(self) -> None:
        if self._kept is not None:
            _timed_shutdown(self._kept, 10)
            self._kept = None
        shm_keep.remove_dir(self.shm_dir)
        self.shm_dir, self._shm_tried = None, False
