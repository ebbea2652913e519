"""Each job's recoveries as Prometheus series (a histogram of seconds, a counter of lost
steps), kept by the operator and rendered into ``/metrics``' per-job block
(``engine.job_metrics``) once per recovery. The leader observes them when it writes a
completed record of ``status.history`` (``metrics.observe_history``)."""

from __future__ import annotations

import threading


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


RECOVERY_BUCKETS = (1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds of the recovery histogram, in seconds (+Inf after them)."""

JobKey = tuple[str, str]


def labels_of(namespace: str, name: str) -> str:
    return f'namespace="{escape(namespace)}",torchjob="{escape(name)}"'


class Recoveries:
    """Each job's recoveries as a Prometheus histogram (seconds) and a counter (steps lost),
    cumulative while the operator runs; a job's lines are rendered once per recovery."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[JobKey, tuple[list[int], float, float]] = {}
        """Per job: the count per bucket (not cumulative, +Inf last), the sum, steps lost."""
        self._lines: dict[JobKey, dict[str, list[str]]] = {}
        self.version = 0
        """Moves with every change (the block's page is rendered again)."""

    def observe(self, key: JobKey, seconds: float, steps_lost: int) -> None:
        with self._lock:
            counts, total, lost = self._jobs.get(key) or (
                [0] * (len(RECOVERY_BUCKETS) + 1),
                0.0,
                0.0,
            )
            slot = next((i for i, b in enumerate(RECOVERY_BUCKETS) if seconds <= b), -1)
            counts = list(counts)
            counts[slot] += 1
            self._jobs[key] = (counts, total + seconds, lost + steps_lost)
            self._lines.pop(key, None)
            self.version += 1

    def forget(self, key: JobKey) -> None:
        with self._lock:
            if self._jobs.pop(key, None) is not None:
                self._lines.pop(key, None)
                self.version += 1

    def of(self, key: JobKey) -> tuple[int, float, float] | None:
        """(count, sum of seconds, steps lost) of ``key``'s recoveries, if it had any."""
        with self._lock:
            hit = self._jobs.get(key)
        return (sum(hit[0]), hit[1], hit[2]) if hit is not None else None

    def samples(self, key: JobKey) -> dict[str, list[str]]:
        """``key``'s lines by family (none before its first recovery)."""
        with self._lock:
            cached = self._lines.get(key)
            if cached is not None:
                return cached
            hit = self._jobs.get(key)
            if hit is None:
                return {}
            counts, total, lost = hit
            labels = labels_of(*key)
            name = "torchjob_job_recovery_seconds"
            lines, running = [], 0
            for bound, n in zip((*RECOVERY_BUCKETS, "+Inf"), counts, strict=True):
                running += n
                lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(running)}')
            lines += [
                f"{name}_count{{{labels}}} {float(running)}",
                f"{name}_sum{{{labels}}} {total}",
            ]
            out = {
                name: lines,
                "torchjob_job_steps_lost": [f"torchjob_job_steps_lost_total{{{labels}}} {lost}"],
            }
            self._lines[key] = out
            return out


RECOVERIES = Recoveries()
"""Observed by the leader's reconciles (``metrics.observe_history``), read by ``/metrics``."""
