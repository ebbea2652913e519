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
