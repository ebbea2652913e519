"""What is coming, told to the training function: Ray Train's ``get_preemption_info()``.

The operator lists the members given notice in ``status.leavingWorkers`` (a pod evicted with
a grace period, or on a node with a termination notice: ``torchjob_operator.torchjob.nodes``)
with the deadline of each. Each pod's driver follows the status (``MembershipWatch``) and,
when that list changes, writes what it means in ranks to a small file beside the pod
(:class:`NoticeWriter`, atomically). Its workers read that file when the training function
asks (:func:`get_preemption_info`: one ``stat`` when nothing changed) and agree on one answer
over the process group, so every rank takes the same branch (a just-in-time checkpoint, a
shorter step). A run on a laptop has no notice: the answer is always None there.

The agreement rides on the collective that ``report()`` and ``should_stop()`` make anyway:
each rank adds the :func:`digest` of what it read to their all-reduce, and only when the sum
moved do the ranks gather the notices themselves (:func:`agree`). A loop that asks every
step then pays nothing for it while no notice changes; ``get_preemption_info()`` answers
what was agreed at the last of those points (a collective of its own only before the
first: ``torchjob.train._report``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchjob import contract


@dataclass(frozen=True)
class PreemptionInfo:
    """Members that will leave, and when the first must be gone."""

    deadline: datetime
    """The earliest deadline (UTC): the training should not count on those ranks after it."""
    ranks: tuple[int, ...]
    """The world ranks that will leave (every process of each leaving pod)."""
    pods: tuple[str, ...]
    reasons: tuple[str, ...]
    """Why, per pod: a termination notice's taint key, or the pod's own disruption."""

    @property
    def seconds_left(self) -> float:
        return max(0.0, (self.deadline - datetime.now(timezone.utc)).total_seconds())

    def merged(self, other: PreemptionInfo) -> PreemptionInfo:
        """Both notices as one (the ranks' reads of a moment apart: the union, the earliest)."""
        pods = dict(zip(self.pods, self.reasons, strict=True))
        pods.update(zip(other.pods, other.reasons, strict=True))
        return PreemptionInfo(
            deadline=min(self.deadline, other.deadline),
            ranks=tuple(sorted({*self.ranks, *other.ranks})),
            pods=tuple(sorted(pods)),
            reasons=tuple(pods[p] for p in sorted(pods)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "deadline": self.deadline.isoformat(),
            "ranks": list(self.ranks),
            "pods": list(self.pods),
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreemptionInfo:
        return cls(
            deadline=datetime.fromisoformat(str(data["deadline"])),
            ranks=tuple(int(r) for r in data["ranks"]),
            pods=tuple(str(p) for p in data["pods"]),
            reasons=tuple(str(r) for r in data["reasons"]),
        )


@dataclass(frozen=True)
class Leaving:
    """One ``status.leavingWorkers`` entry."""

    pod: str
    reason: str
    deadline: datetime | None


def info_of(
    leaving: Sequence[Leaving], ranked: Sequence[int], job: str, nproc_per_node: int
) -> PreemptionInfo | None:
    """The notice in ranks: ``ranked`` is the generation's pod indices in rank order (pod
    ``ranked[i]`` runs ranks ``i * nproc .. (i + 1) * nproc - 1``). A leaving pod that is no
    member (a standby) has no ranks; an entry without a deadline says nothing. Pure."""
    dated = [w for w in leaving if w.deadline is not None]
    if not dated:
        return None
    ranks: set[int] = set()
    prefix = f"{job}-worker-"
    for w in dated:
        index = w.pod[len(prefix) :] if w.pod.startswith(prefix) else ""
        if index.isdigit() and int(index) in ranked:
            first = list(ranked).index(int(index)) * nproc_per_node
            ranks.update(range(first, first + nproc_per_node))
    order = sorted(dated, key=lambda w: w.pod)
    return PreemptionInfo(
        deadline=min(w.deadline for w in dated if w.deadline is not None),
        ranks=tuple(sorted(ranks)),
        pods=tuple(w.pod for w in order),
        reasons=tuple(w.reason for w in order),
    )


def notice_path(pod: contract.PodEnv) -> Path:
    """Where a pod's driver writes its notice for its workers (one per pod, also where
    several pods share a host, as the tests' process kubelet runs them)."""
    name = f"torchjob-notice-{pod.namespace}-{pod.job_name}-{pod.pod_index}.json"
    return Path(tempfile.gettempdir()) / name


class NoticeWriter:
    """The driver's side: ``MembershipWatch.on_change`` calls it with each membership."""

    def __init__(self, path: Path, job: str, nproc_per_node: int) -> None:
        self.path = path
        self.job = job
        self.nproc_per_node = nproc_per_node
        self._last: PreemptionInfo | None = None
        self.clear()

    def __call__(self, leaving: Sequence[Leaving], ranked: Sequence[int]) -> None:
        info = info_of(leaving, ranked, self.job, self.nproc_per_node)
        if info == self._last:
            return
        self._last = info
        if info is None:
            self.clear()
            return
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        with contextlib.suppress(OSError):  # a notice is advice: never fail the driver
            tmp.write_text(json.dumps(info.to_json()))
            tmp.replace(self.path)

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


class NoticeReader:
    """The worker's side: the file's content, read again only when it changed."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._info: PreemptionInfo | None = None

    def read(self) -> PreemptionInfo | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            self._stamp, self._info = None, None
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._info = PreemptionInfo.from_json(json.loads(self.path.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                return self._info  # caught mid-replace or foreign: the last good answer
            self._stamp = stamp
        return self._info


def agree(local: PreemptionInfo | None) -> PreemptionInfo | None:
    """One answer on every rank: each rank's read, merged (a collective over the default
    process group when there is one with more than one rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return local
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, None if local is None else local.to_json())
    infos = [PreemptionInfo.from_json(s) for s in seen if s is not None]
    if not infos:
        return None
    out = infos[0]
    for other in infos[1:]:
        out = out.merged(other)
    return out


def digest(info: PreemptionInfo | None) -> int:
    """A number that changes when ``info`` does: 0 for none, else ``2**32 + crc32`` of its
    JSON (summed over at most a few thousand ranks it stays far inside an int64, and a
    change in who holds a notice moves the sum by whole ``2**32``)."""
    if info is None:
        return 0
    text = json.dumps(info.to_json(), sort_keys=True).encode()
    return (1 << 32) + zlib.crc32(text)


_reader: NoticeReader | None = None


def read_local() -> PreemptionInfo | None:
    """This rank's read of its pod's notice file (no collective; None on a laptop)."""
    global _reader
    if _reader is None:
        pod = contract.PodEnv.from_env()
        _reader = NoticeReader(notice_path(pod) if pod is not None else None)
    return _reader.read()


__all__ = [
    "Leaving",
    "NoticeReader",
    "NoticeWriter",
    "PreemptionInfo",
    "agree",
    "digest",
    "info_of",
    "notice_path",
    "read_local",
]
