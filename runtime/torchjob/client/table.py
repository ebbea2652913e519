"""``kubectl get tj``'s view of TorchJobs (``TorchJobClient.table``): the rows the server
renders from the CRD's printer columns, or the same columns computed here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
"""The ``Accept`` header that asks the API server for a ``meta.k8s.io/v1 Table``."""


@dataclass(frozen=True)
class JobTable:
    """``kubectl get tj``'s view of TorchJobs: the CRD's printer columns as the server renders them."""

    columns: list[str]
    rows: list[list[str]]


def server_table(data: Mapping[str, Any]) -> JobTable:
    """Convert a ``meta.k8s.io/v1 Table`` into rows, keeping the default (priority 0) columns."""
    defs = data.get("columnDefinitions") or []
    keep = [i for i, d in enumerate(defs) if int(d.get("priority", 0)) == 0]
    columns = [str(defs[i]["name"]).upper() for i in keep]
    rows = []
    for row in data.get("rows") or []:
        cells = row.get("cells") or []
        rows.append(["" if cells[i] is None else str(cells[i]) for i in keep if i < len(cells)])
    return JobTable(columns, rows)


def fallback_table(objs: Iterable[Mapping[str, Any]]) -> JobTable:
    """Columns computed client-side, for servers or clients that cannot render a Table."""
    rows = []
    for obj in objs:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        meta = obj.get("metadata") or {}
        rows.append(
            [
                str(meta.get("name", "")),
                str(status.get("phase", "")),
                str(spec.get("replicas", "")),
                str(meta.get("creationTimestamp", "")),
            ]
        )
    return JobTable(["NAME", "PHASE", "REPLICAS", "CREATED"], rows)


HISTORY_COLUMNS = ["GEN", "BEGAN", "CAUSE", "WORLD", "LEFT", "JOINED", "FROM", "RECOVERY", "LOST"]


def history_table(obj: Mapping[str, Any]) -> JobTable:
    """A TorchJob's ``status.history`` as rows, oldest first: why each generation began,
    who left and joined, where the state came from, the loss to the first step, the steps
    done again (``torchjob history``)."""
    rows = []
    for r in (obj.get("status") or {}).get("history") or []:
        recovery = r.get("recoverySeconds")
        lost = r.get("stepsLost")
        rows.append(
            [
                str(r.get("generation", "")),
                str(r.get("began", ""))[:19].replace("T", " "),
                str(r.get("cause", "")),
                str(r.get("worldSize", "")),
                ", ".join(r.get("left") or []) or "-",
                ", ".join(r.get("joined") or []) or "-",
                str(r.get("restoredFrom") or "-"),
                f"{recovery:.1f}s" if isinstance(recovery, int | float) else "-",
                "-" if lost is None else str(lost),
            ]
        )
    return JobTable(list(HISTORY_COLUMNS), rows)
