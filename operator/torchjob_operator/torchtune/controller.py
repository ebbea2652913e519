"""The TorchTune controller: observe the study, plan it (pure), act on the plan.

The decisions are ``torchtune.plan.plan_study``'s; ``observe`` reads the TorchTune and its
trial TorchJobs into one view, ``act`` writes in its documented order. The engine's work
queue runs ``reconcile``: the study's own events, and every event of one of its trial
TorchJobs (``observe.study_of_job``), poke it.
"""

from __future__ import annotations

from torchjob_operator.common.clock import Clock, utcnow
from torchjob_operator.engine.cached import CachedKube
from torchjob_operator.engine.queue import Key, Result
from torchjob_operator.engine.settings import OperatorSettings
from torchjob_operator.torchtune.act import act
from torchjob_operator.torchtune.observe import observe


class StudyController:
    """``engine.queue.Controller`` for TorchTunes."""

    kind = "torchtune"

    def __init__(
        self,
        kube: CachedKube,
        settings: OperatorSettings,
        clock: Clock = utcnow,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock

    def keys(self, namespaces: tuple[str, ...]) -> list[Key]:
        return self.kube.list_tunes(namespaces)

    def catching_up(self, key: Key) -> float | None:
        return None  # the study is read live; its trials' writes are their own loops'

    def reconcile(self, namespace: str, name: str) -> Result:
        # Lazily: optuna costs 15 MiB of RSS, which an operator without studies never pays.
        from torchjob_operator.torchtune.plan import plan_study

        view = observe(self.kube, namespace, name)
        if view is None:
            return Result(gone=True)
        plan = plan_study(view.tune, view.jobs, self.clock())
        return act(self.kube, view, plan, component=self.settings.component)

    def forget(self, key: Key) -> None:
        pass


__all__ = ["StudyController"]
