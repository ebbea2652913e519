"""What a survivor's runtime writes into ``status.silentWorkers`` (``SilentReports``): a
server-side apply, under the reporter's own field manager, of every pod it found silent in
the current generation; the CRD makes the list a map keyed by reporter and pod, so the API
server keeps every reporter's entries (tests/cluster/test_silent_reports.py writes them)."""

from __future__ import annotations

from typing import Any

from tests.unit.builders import pod_env

from torchjob.api.crd import build_crd
from torchjob.train.survivors import SilentReports


class Applies:
    """Where the applies go (the API server's merge is the cluster test's)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def apply(self, body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
        self.sent.append((field_manager, body))
        return {}


def entries(body: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(e["pod"], e["generation"], e["by"]) for e in body["status"]["silentWorkers"]]


def test_an_apply_holds_every_report_of_the_generation_under_the_reporters_manager() -> None:
    sink = Applies()
    reports = SilentReports(sink, pod_env(job_name="tj", pod_index=1, nproc_per_node=2))
    ranked = (1, 0, 2)  # pod 1 runs ranks 0-1, pod 0 ranks 2-3, pod 2 ranks 4-5
    assert reports.record(ranked, 4, 2, 5.04) and reports.record(ranked, 4, 5, 6.0)
    reports.write()
    manager, body = sink.sent[-1]
    assert manager == "torchjob-silent-tj-worker-1"
    assert body["apiVersion"] == "torchjob.io/v1alpha1" and body["kind"] == "TorchJob"
    assert body["metadata"] == {"name": "tj"}
    # Both: an apply that left the first out would remove it from the status.
    assert entries(body) == [("tj-worker-0", 4, "tj-worker-1"), ("tj-worker-2", 4, "tj-worker-1")]
    assert body["status"]["silentWorkers"][0]["seconds"] == 5.0
    assert not reports.record(ranked, 4, 6, 1.0), "rank 6 is of no pod"
    assert not reports.record(ranked, 3, 0, 1.0), "an older generation"
    assert reports.record((0, 1), 5, 0, 5.0)  # the next generation replaces the last one's
    reports.write()
    assert entries(sink.sent[-1][1]) == [("tj-worker-0", 5, "tj-worker-1")]


def test_silent_workers_is_a_list_map_keyed_by_reporter_and_pod() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    silent = schema["properties"]["status"]["properties"]["silentWorkers"]
    assert silent["x-kubernetes-list-type"] == "map"
    assert silent["x-kubernetes-list-map-keys"] == ["by", "pod"]
    assert {"by", "pod"} <= set(silent["items"]["required"])
