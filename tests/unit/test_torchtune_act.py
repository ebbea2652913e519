"""``torchtune.act``: a study plan is written in its documented order, through the ``Kube``
protocol, and a stale status loses the whole plan."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from torchjob_operator.common.events import Event
from torchjob_operator.torchtune.act import act
from torchjob_operator.torchtune.observe import StudyView, study_of_job

TUNE = {
    "apiVersion": "torchjob.io/v1alpha1",
    "kind": "TorchTune",
    "metadata": {"name": "st", "namespace": "ns", "resourceVersion": "7", "uid": "u"},
    "spec": {"pruneAction": "Suspend"},
    "status": {"phase": "Running"},
}


class Recorder:
    """The Kube calls a study makes, in order."""

    def __init__(self, *, conflict: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.conflict = conflict

    def patch_tune_status(
        self, namespace: str, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> bool:
        self.calls.append(("status", name, resource_version))
        return not self.conflict

    def create_job(self, body: dict[str, Any]) -> bool:
        self.calls.append(("create", body["metadata"]["name"]))
        return True

    def suspend_job(self, namespace: str, name: str) -> bool:
        self.calls.append(("suspend", name))
        return True

    def delete_job(self, namespace: str, name: str) -> None:
        self.calls.append(("delete", name))

    def post_event(
        self, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        self.calls.append(("event", obj["kind"], type_, reason, message, component))


def _plan(**kw: Any) -> Any:
    base: dict[str, Any] = {
        "status": {"phase": "Running", "trials": []},
        "create": [{"metadata": {"name": "st-1", "namespace": "ns"}}],
        "prune": ["st-0"],
        "stop": ["st-2"],
        "events": [Event("Normal", "TrialPruned", "st-0: pruned by the median pruner at step 3")],
        "requeue_after_s": 5.0,
    }
    return SimpleNamespace(**{**base, **kw})


def test_status_first_then_trials_then_prunes_and_stops_then_events() -> None:
    kube = Recorder()
    result = act(kube, StudyView(tune=TUNE, jobs={}), _plan(), component="op")  # type: ignore[arg-type]
    assert kube.calls == [
        ("status", "st", "7"),
        ("create", "st-1"),
        ("suspend", "st-0"),
        ("delete", "st-2"),
        (
            "event",
            "TorchTune",
            "Normal",
            "TrialPruned",
            "st-0: pruned by the median pruner at step 3",
            "op",
        ),
    ]
    assert result.requeue_after_s == 5.0 and not result.gone


def test_a_stale_status_drops_the_plan_and_reads_again_at_once() -> None:
    kube = Recorder(conflict=True)
    result = act(kube, StudyView(tune=TUNE, jobs={}), _plan(), component="op")  # type: ignore[arg-type]
    assert kube.calls == [("status", "st", "7")]
    assert result.requeue_after_s == 0.0


def test_an_unchanged_status_is_not_written() -> None:
    kube = Recorder()
    plan = _plan(status=TUNE["status"], create=[], prune=[], stop=[], events=[])
    act(kube, StudyView(tune=TUNE, jobs={}), plan, component="op")  # type: ignore[arg-type]
    assert kube.calls == []


def test_a_trial_names_its_study() -> None:
    ref = {
        "kind": "TorchTune",
        "controller": True,
        "apiVersion": "torchjob.io/v1alpha1",
        "name": "st",
    }
    assert study_of_job({"metadata": {"ownerReferences": [ref]}}) == "st"
    assert study_of_job({"metadata": {"ownerReferences": [{**ref, "controller": False}]}}) is None
    assert study_of_job({"metadata": {}}) is None
