"""``torchjob describe JOB`` (and ``kubectl torchjob describe``): a TorchJob's state, its
conditions, its generations (``status.history``) and its latest Events, in one page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchjob.client.table import JobTable, history_table


def job_events(client: Any, name: str, namespace: str | None = None) -> list[Any]:
    """The Events of TorchJob ``name``, oldest first."""
    ns = namespace or client.namespace
    selector = f"involvedObject.kind=TorchJob,involvedObject.name={name}"
    items = client.core.list_namespaced_event(ns, field_selector=selector).items
    return sorted(items, key=lambda e: str(e.last_timestamp or e.event_time or ""))


def _line(label: str, value: object) -> str:
    return f"{label + ':':<16}{'' if value is None else value}"


def summary(obj: Mapping[str, Any]) -> list[str]:
    """The job's state in a few lines."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    s = obj.get("status") or {}
    failure = s.get("lastFailure") or {}
    progress = s.get("progress") or {}
    lines = [
        _line("Name", f"{meta.get('namespace')}/{meta.get('name')}"),
        _line("Phase", s.get("phase")),
        _line("Workers", f"{s.get('workers', '-')} (spec.replicas {spec.get('replicas')})"),
        _line(
            "Generation", f"{s.get('currentGeneration', 0)}, world size {s.get('worldSize', '-')}"
        ),
        _line(
            "Losses",
            f"{s.get('restarts', 0)} restarts charged, {s.get('disruptions', 0)} disruptions"
            + (
                f" ({', '.join(f'{k} {v}' for k, v in sorted(s['losses'].items()))})"
                if s.get("losses")
                else ""
            ),
        ),
    ]
    if failure:
        lines.append(
            _line(
                "Last failure",
                f"{failure.get('pod')}: {failure.get('message') or failure.get('reason')}",
            )
        )
    if progress:
        lines.append(
            _line(
                "Progress",
                f"step {progress.get('step')}, epoch {progress.get('epoch', '-')}, "
                f"checkpoint {progress.get('lastCheckpoint', '-')}",
            )
        )
    return lines


def conditions_table(obj: Mapping[str, Any]) -> JobTable:
    rows = [
        [
            str(c.get("type")),
            str(c.get("status")),
            str(c.get("reason", "")),
            str(c.get("message", "")),
        ]
        for c in (obj.get("status") or {}).get("conditions") or []
    ]
    return JobTable(["TYPE", "STATUS", "REASON", "MESSAGE"], rows)


def events_table(events: Sequence[Any], last: int = 15) -> JobTable:
    rows = [
        [
            str(e.type),
            str(e.reason),
            str(e.last_timestamp or e.event_time or "")[:19],
            str(e.message),
        ]
        for e in events[-last:]
    ]
    return JobTable(["TYPE", "REASON", "LAST SEEN", "MESSAGE"], rows)


def sections(
    obj: Mapping[str, Any], events: Sequence[Any]
) -> list[tuple[str, JobTable | list[str]]]:
    """The page: a title and either lines or a table, in order."""
    return [
        ("", summary(obj)),
        ("Conditions", conditions_table(obj)),
        ("History", history_table(obj)),
        ("Events", events_table(events)),
    ]
